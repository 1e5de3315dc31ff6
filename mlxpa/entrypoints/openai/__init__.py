"""``mlxpa serve``: the OpenAI API (vLLM's OpenAI-compatible server) on mlxpa's engine.
:mod:`~mlxpa.entrypoints.openai.protocol` (the bodies, for the OpenAPI schema),
:mod:`~mlxpa.entrypoints.openai.requests` (a body to an engine request, through the file run's
row check), :mod:`~mlxpa.entrypoints.openai.serving` (responses and streams),
:mod:`~mlxpa.entrypoints.openai.errors` (OpenAI's error object),
:mod:`~mlxpa.entrypoints.openai.metrics` (Prometheus), :mod:`~mlxpa.entrypoints.openai.asgi`
(API key, body limit, disconnects), :mod:`~mlxpa.entrypoints.openai.app` (the routes),
:mod:`~mlxpa.entrypoints.openai.server` (uvicorn with a drain). Imports nothing itself.
"""
