"""The engine's side of the disk KV tier (``--kv-cache-dir``): the folder, the namespace the
blocks are keyed under, the store, and its figures for the counters.

The namespace (:func:`mlxpa.core.disk_cache.namespace_key`) hashes everything a block's bytes
depend on besides its tokens: the model (its folder's fingerprint, or its weights' when the
engine was handed a model object), the adapter, the tokenizer, the compute dtype, the KV
cache dtype and group size, the block size, the KV cache groups and the bytes of a block,
the attention backend and fused CPU ops, the MLX version and device, and the file format.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from mlxpa.config import EngineConfig
from mlxpa.core.disk_cache import FORMAT_VERSION, DiskStore, namespace_key
from mlxpa.engine.metrics import Counters

# --kv-cache-dir auto: this folder under the mlxpa cache ($XDG_CACHE_HOME/mlxpa).
AUTO = "auto"


def kv_cache_folder(value: str) -> Path:
    """The folder of ``--kv-cache-dir``: ``auto`` is ``$XDG_CACHE_HOME/mlxpa/kv`` (or
    ``~/.cache/mlxpa/kv``)."""
    if value == AUTO:
        from mlxpa.loader.converted import cache_dir

        return cache_dir() / "kv"
    return Path(value).expanduser()


def disk_identity(config: EngineConfig, runner, model, tokenizer,
                  model_folder: str | Path | None) -> dict:
    """What the namespace hashes (see the module docstring) for ``runner``'s storage; the
    folder's fingerprint is cheap, a model object's weights are hashed (O(weights))."""
    from mlxpa.worker.identity import tokenizer_fingerprint, weights_fingerprint

    if model_folder is not None:
        model_id = folder_identity(model_folder)
        tok = None  # the folder's files
    else:
        model_id = {"weights": weights_fingerprint(model), "name": type(model).__module__}
        tok = tokenizer_fingerprint(tokenizer)
    return storage_identity(config, model_id, tok, str(runner.dtype),
                            runner.kv_storage, model_folder is not None)


def folder_identity(folder: str | Path) -> dict:
    """The model's part of the identity of a model loaded from ``folder`` (its files'
    fingerprint, no weight read).

    Raises:
        OSError: The folder cannot be listed.
    """
    from mlxpa.loader.identity import folder_fingerprint

    return {"folder": folder_fingerprint(folder), "name": Path(folder).name}


def storage_identity(config: EngineConfig, model_id: dict, tokenizer: str | None, dtype: str,
                     storage, from_folder: bool = True) -> dict:
    """The namespace's identity from its parts: the model's (``model_id``), the tokenizer's
    fingerprint (None: the model folder's files), the compute ``dtype``'s name, and the KV
    storage (:class:`~mlxpa.worker.kv_storage.KVStorage`: groups, slots, block bytes, a
    snapshot's bytes); the adapter counts when the model came from a folder (applied into a
    model object's weights otherwise)."""
    from mlxpa.loader.identity import folder_fingerprint
    from mlxpa.worker.identity import runtime_identity

    layout = storage.layout
    adapter = (folder_fingerprint(config.adapter_path)
               if from_folder and config.adapter_path else None)
    identity = {
        "format": FORMAT_VERSION, "model": model_id, "adapter": adapter, "tokenizer": tokenizer,
        "dtype": dtype, "kv_cache_dtype": config.kv_cache_dtype,
        "kv_group_size": config.kv_group_size, "block_size": config.block_size,
        "groups": [[g.sliding_window, list(g.entries)] for g in layout.groups],
        "num_slots": layout.num_slots, "block_nbytes": storage.block_bytes(config.block_size),
        "attention_backend": config.attention_backend, "fused_cpu_ops": config.fused_cpu_ops,
        **runtime_identity(),
    }
    if layout.recurrent:  # absent otherwise: the namespaces of models without are unchanged
        identity["recurrent"] = [list(layout.recurrent), storage.snapshot_bytes]
    return identity


def open_disk_store(config: EngineConfig, runner, model, tokenizer,
                    model_folder: str | Path | None) -> DiskStore | None:
    """The disk tier's store for ``config.kv_cache_dir`` (None when unset, or when the
    folder cannot be made: one warning, the engine runs without the tier)."""
    if config.kv_cache_dir is None:
        return None
    folder = kv_cache_folder(config.kv_cache_dir)
    identity = disk_identity(config, runner, model, tokenizer, model_folder)
    try:
        return DiskStore(folder, namespace_key(identity), identity,
                         int(config.kv_cache_disk_gb * 2**30), runner.block_bytes,
                         len(runner.kv_cache_layout.groups), warn=_warn_once,
                         snapshot_nbytes=runner.kv_storage.snapshot_bytes)
    except OSError as e:
        _warn_once(f"the KV disk cache is off: {folder}: {e.strerror or e}")
        return None


def existing_disk_store(config: EngineConfig, model_folder: str | Path, dtype: str,
                        storage) -> DiskStore | None:
    """The store a run of ``config`` (the model loaded from ``model_folder``, computing in
    ``dtype``, its KV in ``storage``) would open under ``config.kv_cache_dir``, if that
    namespace's folder exists (None otherwise), opened read-only (nothing is created or
    written, not even ``namespace.json``): ``mlxpa plan``'s view of the disk tier,
    identified as :func:`disk_identity` identifies a run's.

    Raises:
        OSError: The model folder or the cache folder cannot be read.
    """
    folder = kv_cache_folder(config.kv_cache_dir)
    identity = storage_identity(config, folder_identity(model_folder), None, dtype, storage)
    namespace = namespace_key(identity)
    if not (folder / namespace[:16]).is_dir():
        return None
    return DiskStore(folder, namespace, identity, int(config.kv_cache_disk_gb * 2**30),
                     storage.block_bytes(config.block_size), len(storage.layout.groups),
                     background=False, snapshot_nbytes=storage.snapshot_bytes, read_only=True)


def _warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=2)


def record_disk(counters: Counters, store: DiskStore, disk_hit_tokens: int) -> None:
    """Add the store's counts since the last call, and ``disk_hit_tokens`` (prompt tokens
    of hits read from disk since then), to ``counters``."""
    stats = store.take_stats()
    counters.disk_on = True
    for f in dataclasses.fields(stats):
        if f.name != "read_s":
            name = f"disk_{f.name}"
            setattr(counters, name, getattr(counters, name) + getattr(stats, f.name))
    counters.disk_cached_prompt_tokens += disk_hit_tokens
    counters.disk_files, counters.disk_bytes = store.num_files, store.num_bytes
