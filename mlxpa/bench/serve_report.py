"""Reporting for ``mlxpa bench serve``: a rich table, vLLM's throughput line per run, JSON and
a matplotlib plot of latency against throughput over the load levels."""

from __future__ import annotations

import json

from rich.table import Table

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


def runs_table(runs: list[ServeRun], title: str) -> Table:
    """One row per system and load level: requests, throughput, TTFT / ITL / E2E
    percentiles (p50/p90/p99), failures by kind, peak RSS of the server's processes."""
    t = Table(title=title)
    cols = ("system", "load", "done", "failed", "req/s", "out tok/s", "total tok/s",
            "TTFT s p50/p90/p99", "ITL ms p50/p90/p99", "E2E s p50/p90/p99", "peak RSS MiB")
    for c in cols:
        t.add_column(c, justify="left" if c in ("system", "load", "failed") else "right")
    for r in runs:
        f = r.figures
        rss = f.get("peak_rss_bytes")
        t.add_row(r.system, r.load, str(f["completed"]), _failures(f),
                  f"{f['requests_per_s']:.2f}", f"{f['output_tokens_per_s']:.1f}",
                  f"{f['total_tokens_per_s']:.1f}", _three(f, "ttft", 1),
                  _three(f, "itl", 1e3), _three(f, "e2e", 1),
                  "-" if rss is None else f"{rss / 2**20:.0f}")
    return t


def throughput_line(run: ServeRun) -> str:
    """vLLM's summary line, named by system and load level."""
    f = run.figures
    return (f"{run.system} {run.load}: Throughput: {f['requests_per_s']:.2f} requests/s, "
            f"{f['total_tokens_per_s']:.2f} total tokens/s, "
            f"{f['output_tokens_per_s']:.2f} output tokens/s")


def problem_lines(runs: list[ServeRun], failed: dict[str, str]) -> list[str]:
    """A line per system that did not start and per run with failed or unsent requests."""
    lines = [f"{name}: not measured: {why}" for name, why in failed.items()]
    for r in runs:
        f = r.figures
        if f["failed"] or f["not_sent"]:
            lines.append(f"{r.system} {r.load}: {f['failed']} failed ({_failures(f)}), "
                         f"{f['not_sent']} not sent; first error: {f['first_error']}")
    return lines


def write_json(path: str, workload: dict, load: dict, machine: dict, runs: list[ServeRun],
               failed: dict[str, str]) -> None:
    """``{"workload", "load", "machine", "runs": [{"system", "load", ...figures}],
    "not_measured": {system: why}}``."""
    with open(path, "w") as f:
        json.dump({"workload": workload, "load": load, "machine": machine,
                   "runs": [{"system": r.system, "load": r.load, **r.figures} for r in runs],
                   "not_measured": failed}, f, indent=2)


PANELS = (("ttft", "TTFT (s)", 1.0), ("itl", "ITL (ms)", 1e3), ("e2e", "end-to-end (s)", 1.0))


def write_plot(path: str, runs: list[ServeRun], title: str) -> None:
    """Latency against output tokens/s, one panel each for TTFT, ITL and end-to-end latency:
    per system a line through its load levels (p50 solid, p99 dashed, each point named by its
    level); ``mlxpa-offline``'s throughput as a vertical line (it has no latency).

    Raises:
        ImportError: matplotlib is missing (``pip install 'mlxpa[bench]'``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    systems = list(dict.fromkeys(r.system for r in runs if r.system != OFFLINE))
    offline = [r for r in runs if r.system == OFFLINE]
    for ax, (key, label, scale) in zip(axes, PANELS):
        for k, name in enumerate(systems):
            mine = [r for r in runs if r.system == name and r.figures["completed"]]
            xs = [r.figures["output_tokens_per_s"] for r in mine]
            for q, style in ((50, "-"), (99, "--")):
                ys = [(r.figures[f"{key}_p{q}_s"] or 0.0) * scale for r in mine]
                ax.plot(xs, ys, style, marker="o", color=f"C{k}", label=f"{name} p{q}")
            for r, x in zip(mine, xs):
                ax.annotate(r.load, (x, (r.figures[f"{key}_p50_s"] or 0.0) * scale),
                            textcoords="offset points", xytext=(4, 4), fontsize=8)
        for r in offline:
            ax.axvline(r.figures["output_tokens_per_s"], color="C7", linestyle=":",
                       label=f"{OFFLINE} (throughput only)")
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
