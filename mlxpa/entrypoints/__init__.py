"""The Python API, vLLM's offline one (``vllm.entrypoints.llm``): :mod:`~mlxpa.entrypoints.llm`
(:class:`LLM`: ``generate``, ``chat``, ``generate_iter``), :mod:`~mlxpa.entrypoints.outputs`
(``RequestOutput``, ``CompletionOutput``, ``Logprob``), :mod:`~mlxpa.entrypoints.prompts` (the
calls' arguments to engine requests, through the input processor),
:mod:`~mlxpa.entrypoints.rows` (a dict prompt: a row of ``mlxpa run``),
:mod:`~mlxpa.entrypoints.engine_args` (the ``LLM`` keywords checked, as ``EngineConfig``'s fields);
:mod:`~mlxpa.entrypoints.openai`, the OpenAI-compatible server of ``mlxpa serve``.
``import mlxpa`` exports them; this package imports nothing itself, so
``mlxpa.entrypoints.outputs`` stays light (``llm`` loads mlx).
"""
