"""Replace a file atomically: write a temporary file beside it, then rename it over the target."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def atomic_rewrite(path: str) -> Iterator[str]:
    """Yield a temporary path in ``path``'s folder; on a clean exit it replaces ``path``.

    The new file gets the mode of the file it replaces, or ``0o666 & ~umask`` for a new file
    (``mkstemp`` alone would leave it ``0o600``); its data is fsynced before the rename. On an
    exception the temporary file is removed and ``path`` is untouched. The temporary name is
    ``.<name>.<random>.tmp``, so a caller can find one an interrupted process left behind.

    Raises:
        OSError: The temporary file cannot be created, written or renamed.
    """
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        yield tmp
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mask = os.umask(0)
            os.umask(mask)
            mode = 0o666 & ~mask
        os.chmod(tmp, mode)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def check_output_path(target: str) -> None:
    """Check, before any work, that results can be written at ``target``, without changing
    anything that exists.

    - ``target`` is not a folder, and its folder exists and is a folder;
    - a new file can be written in that folder: a temporary ``.<name>.<random>.tmp`` file is
      created there, one byte written, and removed (the Parquet writer and ``--resume``'s
      rewrite in input order write beside the target and rename; this finds a read-only
      folder or file system and a full disk, whoever runs it: root passes permission bits);
    - an existing regular file opens for writing (``O_APPEND``: no byte of it changes);
    - an existing character device (``/dev/null``, ``/dev/full``) takes a zero-byte write,
      which ``/dev/full`` refuses with ``ENOSPC``; a pipe is not probed.

    Raises:
        ValueError: Naming ``target`` and why it cannot be written.
    """
    if os.path.isdir(target):
        raise ValueError(f"{target} is a folder; give a file path")
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.exists(folder):
        raise ValueError(f"{target}: the output folder {folder} does not exist")
    if not os.path.isdir(folder):
        raise ValueError(f"{target}: {folder} is not a folder")
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise ValueError(f"{target}: cannot be written ({e.strerror})") from None
    if mode is not None and not stat.S_ISREG(mode):
        if stat.S_ISCHR(mode):
            _probe(target, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY, f"{target}: cannot be "
                   "written")
        return
    if mode is not None:
        _probe(target, os.O_WRONLY | os.O_APPEND, f"{target}: the file cannot be written",
               write=False)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp",
                                   dir=folder)
    except OSError as e:
        raise ValueError(f"{target}: cannot write a file in {folder} ({e.strerror})") from None
    try:
        os.write(fd, b"\0")
    except OSError as e:
        raise ValueError(f"{target}: cannot write a file in {folder} ({e.strerror})") from None
    finally:
        os.close(fd)
        os.remove(tmp)


def _probe(path: str, flags: int, message: str, write: bool = True) -> None:
    """Open ``path`` with ``flags`` (and write zero bytes when ``write``); ``ValueError``
    with ``message`` and the reason when either fails."""
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise ValueError(f"{message} ({e.strerror})") from None
    try:
        if write:
            os.write(fd, b"")
    except OSError as e:
        raise ValueError(f"{message} ({e.strerror})") from None
    finally:
        os.close(fd)
