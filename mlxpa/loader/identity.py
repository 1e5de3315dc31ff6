"""What a model folder is, cheaply: the disk KV tier's model identity (no weight is read).

A folder's identity is the hash of its ``config.json`` and the name, size and modification
time of every file in it (weights, tokenizer files, templates): a changed, converted again or
re-downloaded model gets a new identity, so blocks another version computed are never read
(:mod:`mlxpa.core.disk_cache`). An adapter folder is fingerprinted the same way.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def folder_fingerprint(folder: str | os.PathLike[str]) -> str:
    """A hex digest of ``folder``'s ``config.json`` bytes and of each regular file's name,
    size and modification time (nanoseconds; symbolic links followed, as the Hugging Face
    cache's are).

    Raises:
        OSError: The folder cannot be listed.
    """
    folder = Path(folder)
    h = hashlib.sha256()
    config = folder / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name.startswith(".") or not entry.is_file():
            continue
        st = entry.stat()
        h.update(f"{entry.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()
