"""The Python API, vLLM's offline one (``vllm.entrypoints.llm``): :mod:`~mlxpa.entrypoints.llm`
(:class:`LLM`: ``generate``, ``chat``, ``generate_iter``, ``annotate``),
:mod:`~mlxpa.entrypoints.outputs` (what they return), :mod:`~mlxpa.entrypoints.prompts` (the
calls' arguments to engine requests), :mod:`~mlxpa.entrypoints.engine_args` (the ``LLM``
keywords); :mod:`~mlxpa.entrypoints.openai`, the OpenAI-compatible server of ``mlxpa serve``.
This package imports nothing itself, so ``mlxpa.entrypoints.outputs`` stays light.
"""
