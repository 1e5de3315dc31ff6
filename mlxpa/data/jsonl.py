"""JSONL output: the sink behind :class:`~mlxpa.data.write.ResultWriter`, and the JSON fallback
both output formats use for values JSON cannot hold."""

from __future__ import annotations

import json
import sys
from typing import Any

from mlxpa.data.read import STDIN


def json_default(value: Any) -> Any:
    """``json.dumps`` fallback that never fails (a result that cannot be written is lost):
    numpy values become lists or numbers, anything else its ``str``."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


class JsonlSink:
    """Append or write JSON lines to ``path`` (``"-"``: stdout), one flush per release.

    Raises:
        OSError: The file cannot be opened.
    """

    def __init__(self, path: str, append: bool) -> None:
        self._own = path != STDIN
        mode = "a" if append else "w"
        self._f = open(path, mode, encoding="utf-8", newline="\n") if self._own else None

    @property
    def _out(self):
        # stdout is looked up at each write: a live progress display may have redirected it
        # (rich prints it above the bar when stdout and stderr are the same terminal).
        return self._f if self._own else sys.stdout

    def write(self, groups: list[list[dict]]) -> None:
        """Write every record of ``groups`` as one line each, then flush."""
        # NOTE: one write and one flush per release; a signal handler runs between bytecodes,
        # never inside write(), so Ctrl-C cannot leave half a line behind.
        out = self._out
        out.write("".join(json.dumps(r, ensure_ascii=False, default=json_default) + "\n"
                          for g in groups for r in g))
        out.flush()

    def close(self) -> None:
        """Close the file (stdout is only flushed)."""
        if self._own:
            self._f.close()
        else:
            sys.stdout.flush()
