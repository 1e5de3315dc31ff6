"""The disk tier's folder as a whole: the block files under its namespace folders, what
``mlxpa cache list`` shows and ``mlxpa cache clear`` removes, and the file operations the
store builds on (an atomic write, a removal that tolerates a racing process).

Pure Python (no mlx). Only the tier's own names are touched: namespace folders of
:data:`NAMESPACE_DIGITS` hex digits, their two-digit shard folders, ``*.kvb`` files and their
writers' temporary files (:mod:`mlxpa.core.disk_cache` writes them).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import NamedTuple

SUFFIX = ".kvb"
TMP = ".tmp-"
# A namespace's folder: the first hex digits of its key (anything else under a cache folder
# is not the tier's, and listing, cleaning and clearing leave it alone).
NAMESPACE_DIGITS = 16


class CacheFile(NamedTuple):
    """One file under a cache folder: path, bytes, modification time, whether it is a
    writer's temporary file, the namespace folder it is in."""

    path: str
    nbytes: int
    mtime: float
    temporary: bool
    namespace: str


def is_namespace_folder(name: str, digits: int = NAMESPACE_DIGITS) -> bool:
    """Whether ``name`` is a namespace folder's (:attr:`DiskStore.folder`: 16 hex digits;
    ``digits=2``: a shard folder's in it)."""
    return len(name) == digits and all(c in "0123456789abcdef" for c in name)


def list_files(root: str | os.PathLike[str]) -> list[CacheFile]:
    """Every block file (and temporary file) under ``root``'s namespace folders."""
    out: list[CacheFile] = []
    root = os.fspath(root)
    for space in _scan(root):
        for shard in _scan(space.path, 2):
            try:
                entries = list(os.scandir(shard.path))
            except OSError:
                continue
            for e in entries:
                tmp = SUFFIX + TMP in e.name
                if not (tmp or e.name.endswith(SUFFIX)):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                out.append(CacheFile(e.path, st.st_size, st.st_mtime, tmp, space.name))
    return out


class NamespaceSummary(NamedTuple):
    """One namespace folder of a cache folder (``mlxpa cache list``): its name, the model
    it was written for (``namespace.json``), its block files, their bytes, the newest use."""

    namespace: str
    model: str
    num_files: int
    nbytes: int
    last_used: float


def summarize_folder(root: str | os.PathLike[str]) -> list[NamespaceSummary]:
    """The namespaces under ``root``, most recently used first."""
    by: dict[str, list[CacheFile]] = {}
    for f in list_files(root):
        by.setdefault(f.namespace, []).append(f)
    out = []
    for space in (e.name for e in _scan(os.fspath(root))):
        files = [f for f in by.get(space, []) if not f.temporary]
        model = "?"
        try:
            with open(os.path.join(root, space, "namespace.json")) as fh:
                info = json.load(fh)
            model = str(info.get("model", {}).get("name", "?"))
        except (OSError, ValueError, AttributeError):
            pass
        out.append(NamespaceSummary(space, model, len(files), sum(f.nbytes for f in files),
                                    max((f.mtime for f in files), default=0.0)))
    return sorted(out, key=lambda s: -s.last_used)


def clear_folder(root: str | os.PathLike[str], namespace: str | None = None) -> tuple[int, int]:
    """Remove the block files (and temporary files) under ``root``, or one namespace's;
    returns the files and bytes removed. Empty namespace folders go too; nothing else.

    Raises:
        ValueError: ``namespace`` is not a namespace folder's name (16 hex digits).
    """
    if namespace is not None and not is_namespace_folder(namespace):
        raise ValueError(f"--namespace must be a namespace as `mlxpa cache list` shows it "
                         f"({NAMESPACE_DIGITS} hex digits), got {namespace!r}")
    removed = nbytes = 0
    for f in list_files(root):
        if namespace is not None and f.namespace != namespace:
            continue
        if remove_file(f.path):
            removed += 1
            nbytes += f.nbytes
    root = os.fspath(root)
    for space in [namespace] if namespace else [e.name for e in _scan(root)]:
        folder = os.path.join(root, space)
        for shard in _scan(folder, 2):
            try:
                os.rmdir(shard.path)
            except OSError:
                pass
        remove_file(os.path.join(folder, "namespace.json"))
        try:
            os.rmdir(folder)
        except OSError:
            pass
    return removed, nbytes


def _scan(folder: str, digits: int = NAMESPACE_DIGITS) -> list[os.DirEntry]:
    """The namespace folders in ``folder`` (``digits=2``: the shard folders)."""
    try:
        return [e for e in os.scandir(folder)
                if is_namespace_folder(e.name, digits) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def folder_bytes(root: str | os.PathLike[str]) -> int:
    """Bytes of the block files under ``root``."""
    return sum(f.nbytes for f in list_files(root))


def atomic_write(path: str, data: bytes) -> None:
    """``data`` to ``path`` through a temporary file in its folder and ``os.replace``."""
    tmp = f"{path}{TMP}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        remove_file(tmp)
        raise


def remove_file(path: str) -> bool:
    """Remove ``path``; whether it was there (another process may have removed it)."""
    try:
        os.remove(path)
        return True
    except OSError:
        return False


__all__ = ["CacheFile", "NAMESPACE_DIGITS", "NamespaceSummary", "SUFFIX", "TMP", "atomic_write",
           "clear_folder", "folder_bytes", "is_namespace_folder", "list_files", "remove_file",
           "summarize_folder"]
