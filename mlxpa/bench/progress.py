"""``mlxpa bench`` progress on stderr: a bar per timed system run (never on stdout, which
carries the results line)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


class BenchBar:
    """One bar of :class:`BenchProgress`: ``advance(n)`` output tokens, ``done(result)``."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress, self._task = progress, task

    def advance(self, n: int) -> None:
        """Count ``n`` more output tokens (redrawn at rich's refresh rate, 10 times a second)."""
        if n:
            self._progress.advance(self._task, n)

    def done(self, result: str) -> None:
        """Stop the bar's clock and show ``result`` (the run's rate) after it."""
        self._progress.update(self._task, result=result)
        self._progress.stop_task(self._task)


class BenchProgress:
    """``mlxpa bench`` progress: a bar per timed system run (output tokens done / total,
    elapsed, then its rate), each kept on screen below the ones before.

    As ``mlxpa run``'s bar: drawn live on a stderr terminal; to a file or pipe rich prints the
    bars once, when the bench ends; nothing with ``enabled`` False (``--quiet``).

    Args:
        console: Where to draw (default: stderr).
        enabled: False draws nothing.
    """

    def __init__(self, console: Console | None = None, enabled: bool = True) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("tokens"), TimeElapsedColumn(), TextColumn("{task.fields[result]}"),
            console=console or Console(stderr=True), disable=not enabled, transient=False,
            redirect_stdout=False, redirect_stderr=False)

    def __enter__(self) -> BenchProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def bar(self, label: str, total: int) -> BenchBar:
        """A new bar named ``label`` for ``total`` output tokens; its clock starts now."""
        return BenchBar(self._progress, self._progress.add_task(label, total=total, result=""))
