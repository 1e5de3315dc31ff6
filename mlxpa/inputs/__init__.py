"""Prompts to engine requests, for every entry point (the file run, ``LLM``, a server):
:mod:`~mlxpa.inputs.prompts` (what a prompt may be: :class:`ChatPrompt`, the rules of its
fields), :mod:`~mlxpa.inputs.encode` (tokenization and chat templates),
:mod:`~mlxpa.inputs.processor` (:class:`InputProcessor`: prompt + ``SamplingParams`` ->
``EngineRequest``). No mlx; nothing of files.
"""

from mlxpa.inputs.processor import InputProcessor, over_context
from mlxpa.inputs.prompts import ChatPrompt, PromptType

__all__ = ["ChatPrompt", "InputProcessor", "PromptType", "over_context"]
