"""Replace a file atomically: write a temporary file beside it, then rename it over the target."""

from __future__ import annotations

import contextlib
import os
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
    """Check, before any work, that a file can be created at ``target``: it is not a folder
    and its folder exists.

    Raises:
        ValueError: ``target`` is a folder, or its folder does not exist (both named).
    """
    if os.path.isdir(target):
        raise ValueError(f"{target} is a folder; give a file path")
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise ValueError(f"{target}: the output folder {folder} does not exist")
