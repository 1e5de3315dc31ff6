"""Reporting for ``mlxpa bench serve``: a rich table, vLLM's throughput line per run, JSON and
a matplotlib plot of latency against throughput over the load levels. Each row names its
endpoint, the BLAS its system's process mapped, and the prompt tokens per request as that
system counted them; a system on the slow BLAS, or one that counted other prompt tokens than
the workload, gets a line under the table."""

from __future__ import annotations

import json

from rich.table import Table

from mlxpa.bench.process_env import BUNDLED, blas_label
from mlxpa.bench.serve_offline import OFFLINE
from mlxpa.bench.serve_systems import ServeRun


def _num(v: float | None) -> str:
    """Three significant digits or so, no exponent: 0.123, 3.66, 74.1, 1008."""
    if v is None:
        return "-"
    return f"{v:.{2 if abs(v) < 10 else 1 if abs(v) < 100 else 0}f}"


def _three(f: dict, name: str, scale: float) -> str:
    """``p50/p90/p99`` of latency ``name`` times ``scale`` (``-`` for none)."""
    values = [f.get(f"{name}_p{q}_s") for q in (50, 90, 99)]
    if all(v is None for v in values):
        return "-"
    return "/".join(_num(None if v is None else v * scale) for v in values)


def _failures(f: dict) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in sorted(f["failures"].items())) or "0"


def _prompt_mismatch(f: dict) -> bool:
    """The server counted other prompt tokens than the workload (by its ``usage``)."""
    ours = f.get("workload_prompt_tokens")
    return (f.get("prompt_tokens_counted") == "usage" and ours is not None
            and f["prompt_tokens"] != ours)


def _prompt_cell(f: dict) -> str:
    """Prompt tokens per request as the system counted them; ``643 (workload 567)`` when the
    workload counted other tokens."""
    per = f.get("prompt_tokens_per_request")
    if per is None:
        return "-"
    if _prompt_mismatch(f):
        return f"{per:.0f} (workload {f['workload_prompt_tokens'] / f['completed']:.0f})"
    return f"{per:.0f}"


def runs_table(runs: list[ServeRun], title: str, systems: dict[str, dict] | None = None
               ) -> Table:
    """One row per system, endpoint and load level: the BLAS the system's process mapped
    (``systems``: :attr:`~mlxpa.bench.serve_systems.ServeBench.systems`), requests, prompt
    tokens per request as the system counted them, throughput, TTFT / ITL / E2E percentiles
    (p50/p90/p99), failures by kind, peak RSS of the server's processes."""
    t = Table(title=title)
    cols = ("system", "BLAS", "endpoint", "load", "done", "failed", "prompt tok/req", "req/s",
            "out tok/s", "total tok/s", "TTFT s p50/p90/p99", "ITL ms p50/p90/p99",
            "E2E s p50/p90/p99", "peak RSS MiB")
    for c in cols:
        t.add_column(c, justify="left" if c in ("system", "BLAS", "endpoint", "load", "failed")
                     else "right")
    for r in runs:
        f = r.figures
        rss = f.get("peak_rss_bytes")
        t.add_row(r.system, blas_label((systems or {}).get(r.system, {})), r.endpoint or "-",
                  r.load, str(f["completed"]), _failures(f), _prompt_cell(f),
                  f"{f['requests_per_s']:.2f}", f"{f['output_tokens_per_s']:.1f}",
                  f"{f['total_tokens_per_s']:.1f}", _three(f, "ttft", 1),
                  _three(f, "itl", 1e3), _three(f, "e2e", 1),
                  "-" if rss is None else f"{rss / 2**20:.0f}")
    return t


def throughput_line(run: ServeRun) -> str:
    """vLLM's summary line, named by system, endpoint and load level."""
    f = run.figures
    where = " ".join(filter(None, (run.system, run.endpoint, run.load)))
    return (f"{where}: Throughput: {f['requests_per_s']:.2f} requests/s, "
            f"{f['total_tokens_per_s']:.2f} total tokens/s, "
            f"{f['output_tokens_per_s']:.2f} output tokens/s")


def problem_lines(runs: list[ServeRun], failed: dict[str, str],
                  systems: dict[str, dict] | None = None) -> list[str]:
    """A line per system that did not start, per system on MLX's slow bundled BLAS, per run
    with failed or unsent requests, and per run whose server counted other prompt tokens
    than the workload."""
    lines = [f"{name}: not measured: {why}" for name, why in failed.items()]
    for name, record in (systems or {}).items():
        if record.get("blas") == BUNDLED:
            lines.append(f"{name}: its process runs MLX's bundled reference BLAS "
                         f"({record.get('blas_library')}), 10-30x slower matmuls than "
                         "OpenBLAS: its figures do not compare with a system on a fast BLAS")
    for r in runs:
        f = r.figures
        where = " ".join(filter(None, (r.system, r.endpoint, r.load)))
        if f["failed"] or f["not_sent"]:
            lines.append(f"{where}: {f['failed']} failed ({_failures(f)}), "
                         f"{f['not_sent']} not sent; first error: {f['first_error']}")
        if _prompt_mismatch(f):
            ours = f["workload_prompt_tokens"]
            lines.append(f"{where}: the server counted {f['prompt_tokens']:,} prompt tokens, "
                         f"the workload {ours:,} ({f['prompt_tokens'] / ours - 1:+.1%}): it "
                         "did not read the prompts as the same tokens")
    return lines


def write_json(path: str, workload: dict, load: dict, machine: dict, runs: list[ServeRun],
               failed: dict[str, str], systems: dict[str, dict] | None = None) -> None:
    """``{"workload", "load", "machine", "systems": {system: what its process runs on},
    "runs": [{"system", "endpoint", "load", ...figures}], "not_measured": {system: why}}``
    (``machine.blas``: the bench process's own)."""
    with open(path, "w") as f:
        json.dump({"workload": workload, "load": load, "machine": machine,
                   "systems": systems or {},
                   "runs": [{"system": r.system, "endpoint": r.endpoint, "load": r.load,
                             **r.figures} for r in runs],
                   "not_measured": failed}, f, indent=2)


PANELS = (("ttft", "TTFT (s)", 1.0), ("itl", "ITL (ms)", 1e3), ("e2e", "end-to-end (s)", 1.0))


def write_plot(path: str, runs: list[ServeRun], title: str) -> None:
    """Latency against output tokens/s, one panel each for TTFT, ITL and end-to-end latency:
    per system and endpoint a line through its load levels (p50 solid, p99 dashed, each point
    named by its level); ``mlxpa-offline``'s throughput as a vertical line (no latency).

    Raises:
        ImportError: matplotlib is missing (``pip install 'mlxpa[bench]'``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    lines = list(dict.fromkeys((r.system, r.endpoint) for r in runs if r.system != OFFLINE))
    offline = [r for r in runs if r.system == OFFLINE]
    for ax, (key, label, scale) in zip(axes, PANELS):
        for k, line in enumerate(lines):
            name = " ".join(filter(None, line))
            mine = [r for r in runs if (r.system, r.endpoint) == line and r.figures["completed"]]
            xs = [r.figures["output_tokens_per_s"] for r in mine]
            for q, style in ((50, "-"), (99, "--")):
                ys = [(r.figures[f"{key}_p{q}_s"] or 0.0) * scale for r in mine]
                ax.plot(xs, ys, style, marker="o", color=f"C{k}", label=f"{name} p{q}")
            for r, x in zip(mine, xs):
                ax.annotate(r.load, (x, (r.figures[f"{key}_p50_s"] or 0.0) * scale),
                            textcoords="offset points", xytext=(4, 4), fontsize=8)
        for r in offline:
            ax.axvline(r.figures["output_tokens_per_s"], color="C7", linestyle=":",
                       label=f"{' '.join(filter(None, (OFFLINE, r.endpoint)))} "
                       "(throughput only)")
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(label)
        ax.set_title(f"{label.split(' (')[0]} against throughput")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
