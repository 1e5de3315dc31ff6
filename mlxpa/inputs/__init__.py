"""Requests to engine requests, for every entry point (a file row, ``LLM``, a server body):
:mod:`~mlxpa.inputs.schema` (the one request schema: which fields, how they are read and
refused; :mod:`~mlxpa.inputs.unsupported`, :mod:`~mlxpa.inputs.question_fields` and
:mod:`~mlxpa.inputs.prompts` hold its tables and rules), :mod:`~mlxpa.inputs.encode`
(tokenization and chat templates), :mod:`~mlxpa.inputs.processor` (:class:`InputProcessor`:
the one merge with the defaults, to an ``EngineRequest``). No mlx; nothing of files.
"""

from mlxpa.inputs.processor import InputProcessor, over_context
from mlxpa.inputs.prompts import ChatPrompt, PromptType

__all__ = ["ChatPrompt", "InputProcessor", "PromptType", "over_context"]
