"""JSONL output: the sink behind :class:`~mlxpa.data.write.ResultWriter` (strict JSON lines:
:func:`mlxpa.utils.json_line`)."""

from __future__ import annotations

import glob
import os
import sys
from typing import Any

from mlxpa.data.read import STDIN
from mlxpa.utils import json_line


class JsonlSink:
    """Append or write JSON lines to ``path`` (``"-"``: stdout), one flush per release.

    The file is opened at the first write (or at a close that asks for it), so a run stopped
    before any row finished leaves no output behind, and ``--overwrite`` replaces the old file
    only once there is something to put in its place. Appending first removes a temporary file
    that a killed rewrite in input order left beside ``path`` (``.<name>.<random>.tmp``; the
    output itself is whole).

    Raises:
        OSError: The file cannot be opened (at the first write).
    """

    def __init__(self, path: str, append: bool) -> None:
        self._own = path != STDIN
        self._path, self._mode = path, "a" if append else "w"
        if self._own and append:
            folder, name = os.path.split(os.path.abspath(path))
            pattern = os.path.join(glob.escape(folder), f".{glob.escape(name)}.*.tmp")
            for stale in glob.glob(pattern):
                os.remove(stale)
        self._f: Any = None

    @property
    def _out(self):
        # stdout is looked up at each write: a live progress display may have redirected it
        # (rich prints it above the bar when stdout and stderr are the same terminal).
        if not self._own:
            return sys.stdout
        if self._f is None:
            self._f = open(self._path, self._mode, encoding="utf-8", newline="\n")
        return self._f

    def write(self, groups: list[list[dict]]) -> None:
        """Write every record of ``groups`` as one line each, then flush."""
        # NOTE: one write and one flush per release; a signal handler runs between bytecodes,
        # never inside write(), so Ctrl-C cannot leave half a line behind.
        out = self._out
        out.write("".join(json_line(r) + "\n" for g in groups for r in g))
        out.flush()

    def close(self, create: bool = True) -> None:
        """Close the file (stdout is only flushed); ``create``: make it (empty) if nothing was
        written, as a finished run with no rows does."""
        if not self._own:
            sys.stdout.flush()
        elif self._f is not None or create:
            self._out.close()
