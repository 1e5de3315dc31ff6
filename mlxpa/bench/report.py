"""Reporting for ``mlxpa bench``: machine facts, a rich table, vLLM's throughput line,
JSON and a matplotlib plot."""

from __future__ import annotations

import datetime
import json
import os
import platform
from importlib.metadata import version

from rich.table import Table

from mlxpa.bench.systems import SystemResult
from mlxpa.blas import cpuinfo_field, host_memory_bytes, loaded_blas


def machine_info(dtype: str) -> dict:
    """CPU, cores, memory, library versions, dtype, BLAS and date of this run."""
    import mlx.core as mx

    cpu = cpuinfo_field("model name") or platform.processor() or platform.machine()
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": host_memory_bytes(),
            "platform": platform.platform(), "device": str(mx.default_device()),
            "mlx": version("mlx"), "mlx_lm": version("mlx-lm"), "dtype": dtype,
            "blas": loaded_blas(), "date": datetime.datetime.now().isoformat(timespec="seconds")}


def _fmt(v, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}"


def figures_table(figures: dict[str, dict], title: str) -> Table:
    """One row per system: throughput, latency, memory, ratios to mlx-lm and static."""
    t = Table(title=title)
    cols = ["system", "req/s", "total tok/s", "out tok/s", "TTFT p50 s", "ITL p50 ms",
            "peak mem MiB", "KV MiB", "× mlx-lm (total)", "× static (total)"]
    for c in cols:
        t.add_column(c, justify="right" if c != "system" else "left")
    for name, f in figures.items():
        t.add_row(name, _fmt(f["requests_per_s"], digits=2), _fmt(f["total_tokens_per_s"]),
                  _fmt(f["output_tokens_per_s"]), _fmt(f["ttft_p50_s"], digits=2),
                  _fmt(f["itl_p50_s"], 1e3), _fmt(f["peak_memory_bytes"], 2**-20, 0),
                  _fmt(f["kv_bytes"], 2**-20, 0),
                  _fmt(f.get("total_tokens_per_s_ratio_to_mlx-lm"), digits=2),
                  _fmt(f.get("total_tokens_per_s_ratio_to_static"), digits=2))
    return t


def throughput_line(f: dict) -> str:
    """vLLM's summary line."""
    return (f"Throughput: {f['requests_per_s']:.2f} requests/s, "
            f"{f['total_tokens_per_s']:.2f} total tokens/s, "
            f"{f['output_tokens_per_s']:.2f} output tokens/s")


def write_json(path: str, workload: dict, machine: dict, figures: dict[str, dict]) -> None:
    with open(path, "w") as f:
        json.dump({"workload": workload, "machine": machine, "systems": figures}, f, indent=2)


def write_plot(path: str, figures: dict[str, dict], last: dict[str, SystemResult],
               title: str) -> None:
    """Throughput bars per system, and our KV blocks in use over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(figures)
    x = range(len(names))
    a.bar([i - 0.2 for i in x], [figures[n]["total_tokens_per_s"] for n in names], 0.4,
          label="total tok/s")
    a.bar([i + 0.2 for i in x], [figures[n]["output_tokens_per_s"] for n in names], 0.4,
          label="output tok/s")
    a.set_xticks(list(x), names)
    a.set_ylabel("tokens / s")
    a.set_title(title)
    a.legend()
    for name in ("mlxpa", "mlxpa-noprefix"):
        if name in last and last[name].kv_blocks_over_time:
            ts, blocks = zip(*last[name].kv_blocks_over_time)
            b.plot(ts, blocks, label=name)
    b.set_xlabel("seconds")
    b.set_ylabel("KV blocks in use")
    b.set_title("KV blocks in use over time")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
