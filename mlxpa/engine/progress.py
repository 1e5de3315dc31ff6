"""Rich rendering of the engine's counters on stderr: the live progress bar of a batch of
requests (a file run's rows, an ``LLM`` call's prompts) and the final report's table.

The engine only counts (:mod:`mlxpa.engine.metrics`); this module draws, and never on stdout
(stdout carries results in shell pipelines).
"""

from __future__ import annotations

import os
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from mlxpa.engine.metrics import Counters, Stats, summarize

LINE_INTERVAL_S = 10.0  # line mode: seconds between progress lines
REDRAW_S = 0.1  # the bar: seconds between redraws


def same_terminal(a: int = 1, b: int = 2) -> bool:
    """True when file descriptors ``a`` and ``b`` are the same terminal device."""
    try:
        return os.isatty(a) and os.isatty(b) and os.fstat(a).st_rdev == os.fstat(b).st_rdev
    except OSError:
        return False


class RunProgress:
    """Progress over rows: done/total, output tokens per second, elapsed time.

    Where results go to stdout, three cases keep them off the bar: stdout is the bar's
    terminal (rich prints each result line above the bar); stdout is a pipe or file while
    stderr is a terminal (``mlxpa run - | jq``: the consumer may print onto that terminal at
    any time, so no bar is drawn in place; a plain line every 10 s instead); else a bar.

    Args:
        total: Rows expected (None when unknown).
        counters: The engine's counters, read on every update.
        console: Where to draw (stderr).
        enabled: False draws nothing (``--quiet``).
        stdout_results: Results are written to stdout.
    """

    def __init__(self, total: int | None, counters: Counters, console: Console,
                 enabled: bool = True, stdout_results: bool = False) -> None:
        self.counters = counters
        self.console = console
        shared = stdout_results and same_terminal()
        self._lines = (enabled and stdout_results and not shared and console.is_terminal)
        self._total, self._done, self._last_line = total, 0, time.monotonic()
        self._unshown, self._shown_at = 0, 0.0
        self._progress = Progress(
            TextColumn("[bold]mlxpa"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
            console=console, disable=not enabled or self._lines, transient=False,
            redirect_stdout=shared, redirect_stderr=False)
        self._task = self._progress.add_task("run", total=total, rate="")

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._unshown:
            self._show()
        self._progress.stop()

    def advance(self, rows: int = 1) -> None:
        """Count ``rows`` more rows done; redraw at most every :data:`REDRAW_S` seconds and
        at the last row (line mode: a line every 10 s)."""
        # NOTE: a redraw summarizes all counters (percentiles over every TTFT), so it runs at
        # most 10 times a second, not once a row.
        self._unshown += rows
        if (time.monotonic() - self._shown_at >= REDRAW_S
                or self._done + self._unshown == self._total):
            self._show()

    def _show(self) -> None:
        s = summarize(self.counters)
        rate = f"{s.output_tokens_per_s:7.1f} out tok/s"
        self._progress.update(self._task, advance=self._unshown, rate=rate)
        self._done += self._unshown
        self._unshown = 0
        now = self._shown_at = time.monotonic()
        if self._lines and (now - self._last_line >= LINE_INTERVAL_S
                            or self._done == self._total):
            self._last_line = now
            self.console.print(f"mlxpa: {self._done}/{self._total} rows, {rate.strip()}, "
                               f"{s.elapsed_s:.0f} s", markup=False, highlight=False)


def summary_table(stats: Stats, kv_blocks_total: int | None = None,
                  kv_budget_blocks: int | None = None) -> Table:
    """The final report as a two-column table (``kv_blocks_total``: the pool's blocks;
    ``kv_budget_blocks``: what the memory budget allowed)."""
    t = Table(title="mlxpa run", show_header=False, box=None, pad_edge=False)
    rows = [
        ("requests", f"{stats.requests}"),
        ("failed rows", f"{stats.failed_rows}" + (" (their output rows have an error field)"
                                                  if stats.failed_rows else "")),
        ("prompt tokens", f"{stats.prompt_tokens}"),
        ("cached prompt tokens", f"{stats.cached_prompt_tokens} "
         f"(prefix cache hit rate {stats.prefix_cache_hit_rate:.1%}" + (
             f"; memory {stats.cached_prompt_tokens - stats.disk_cached_prompt_tokens}, disk "
             f"{stats.disk_cached_prompt_tokens})" if stats.kv_disk is not None else ")")),
        ("generated tokens", f"{stats.generation_tokens}"),
        ("elapsed", f"{stats.elapsed_s:.2f} s"),
        ("total tokens/s", f"{stats.total_tokens_per_s:.1f}"),
        ("output tokens/s", f"{stats.output_tokens_per_s:.1f}"),
        ("peak KV blocks", f"{stats.peak_kv_blocks}"
         + (f" of {kv_blocks_total}" if kv_blocks_total else "")
         + (f" (budget {kv_budget_blocks})" if kv_budget_blocks else "")),
        ("KV utilisation", f"{stats.kv_utilization:.1%}"),
        ("preemptions", f"{stats.num_preemptions}"),
        ("evicted blocks", f"{stats.evicted_blocks}"),
    ]
    if stats.kv_disk is not None:
        d = stats.kv_disk
        snaps = (f", {d['snapshots_read']} / {d['snapshots_written']} with a recurrent "
                 f"snapshot" if d["snapshots_read"] or d["snapshots_written"] else "")
        rows.append(("KV disk cache", f"read {d['blocks_read']} blocks ({_mib(d['bytes_read'])}"
                     f"), wrote {d['blocks_written']} ({_mib(d['bytes_written'])}){snaps}; "
                     f"{d['files']} files ({_mib(d['bytes'])}) on disk"
                     + (f"; {d['invalid_files']} invalid files skipped"
                        if d["invalid_files"] else "")))
    if stats.ttft_p50_s is not None:
        rows.append(("TTFT p50 / p99", f"{stats.ttft_p50_s:.3f} / {stats.ttft_p99_s:.3f} s"))
    if stats.itl_p50_s is not None:
        rows.append(("ITL p50 / p99", f"{stats.itl_p50_s * 1e3:.1f} / "
                     f"{stats.itl_p99_s * 1e3:.1f} ms"))
    if stats.spec_decoding:
        spec = stats.spec_decoding
        accepted, drafted = spec["num_accepted_tokens"], spec["num_draft_tokens"]
        rows.append(("draft tokens accepted",
                     f"{accepted} of {drafted} ({accepted / drafted:.1%}; "
                     f"{accepted / spec['num_drafts']:.2f} per verify step)"))
    for k, v in rows:
        t.add_row(f"[bold]{k}", v)
    return t


def _mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:,.1f} MiB"
