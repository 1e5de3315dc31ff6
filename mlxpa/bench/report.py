"""Reporting for ``mlxpa bench``: machine facts, a rich table, vLLM's throughput line,
JSON and a matplotlib plot."""

from __future__ import annotations

import datetime
import json
import os
import platform
from importlib.metadata import version

from rich.table import Table

from mlxpa.bench.flops import ModelFlops
from mlxpa.bench.limits import LimitRow
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
    """One row per system: throughput (an mlxpa system's decode phase apart: output tokens
    of the steps that only decode, over their time), latency, memory (the KV pool's bytes
    per token in its ``--kv-cache-dtype``), ratios to mlx-lm and static."""
    t = Table(title=title)
    cols = ["system", "req/s", "total tok/s", "out tok/s", "decode out tok/s", "TTFT p50 s",
            "ITL p50 ms", "peak mem MiB", "KV MiB", "KV B/token", "× mlx-lm (total)",
            "× static (total)"]
    for c in cols:
        t.add_column(c, justify="right" if c != "system" else "left")
    for name, f in figures.items():
        t.add_row(name, _fmt(f["requests_per_s"], digits=2), _fmt(f["total_tokens_per_s"]),
                  _fmt(f["output_tokens_per_s"]), _fmt(f.get("decode_output_tokens_per_s")),
                  _fmt(f["ttft_p50_s"], digits=2),
                  _fmt(f["itl_p50_s"], 1e3), _fmt(f["peak_memory_bytes"], 2**-20, 0),
                  _fmt(f["kv_bytes"], 2**-20, 0), _kv_per_token(f),
                  _fmt(f.get("total_tokens_per_s_ratio_to_mlx-lm"), digits=2),
                  _fmt(f.get("total_tokens_per_s_ratio_to_static"), digits=2))
    return t


def _kv_per_token(f: dict) -> str:
    """``10,368 int8``: bytes per token of an mlxpa system's KV pool and its storage."""
    if f.get("kv_bytes_per_token") is None:
        return "-"
    return f"{f['kv_bytes_per_token']:,.0f} {f.get('kv_cache_dtype') or ''}".rstrip()


def cascade_line(figures: dict[str, dict]) -> str | None:
    """The gain of cascade attention, ``mlxpa`` over ``mlxpa-nocascade`` (decode phase and
    end to end), or None when the run lacks either system."""
    return _versus_line(figures, "mlxpa-nocascade", "cascade attention")


def speculation_line(figures: dict[str, dict]) -> str | None:
    """The gain of speculative decoding, ``mlxpa`` (with ``--speculative-config``) over
    ``mlxpa-nospec``, or None when the run lacks either system."""
    return _versus_line(figures, "mlxpa-nospec", "speculative decoding")


def _versus_line(figures: dict[str, dict], other: str, what: str) -> str | None:
    """``mlxpa`` over ``other``: decode-phase output tok/s, end-to-end total and output
    tok/s."""
    on, off = figures.get("mlxpa"), figures.get(other)
    if on is None or off is None:
        return None
    decode = on.get(f"decode_output_tokens_per_s_ratio_to_{other}")
    return (f"{what} (mlxpa / {other}): decode-phase output tok/s "
            f"{_fmt(decode, digits=2)}x, end-to-end total tok/s "
            f"{on[f'total_tokens_per_s_ratio_to_{other}']:.2f}x, output tok/s "
            f"{on[f'output_tokens_per_s_ratio_to_{other}']:.2f}x")


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
    """Total and output tokens/s per system (each on its own axis; every other system's bar
    says how many times faster mlxpa is), and KV blocks in use over time from 0 s.

    Args:
        path: PNG path.
        figures: ``run_bench`` figures per system.
        last: The last raw result per system (KV blocks over time).
        title: The workload, shown above the figure.

    Raises:
        ImportError: matplotlib is missing (``pip install 'mlxpa[bench]'``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    names = list(figures)
    for ax, key, label in ((axes[0], "total_tokens_per_s", "total tokens/s"),
                           (axes[1], "output_tokens_per_s", "output tokens/s")):
        values = [figures[n][key] for n in names]
        bars = ax.bar(names, values, color=["C0" if n == "mlxpa" else "C7" for n in names])
        ours = figures.get("mlxpa", {}).get(key)
        for bar, name, v in zip(bars, names, values):
            text = f"{v:.1f}"
            if ours and name != "mlxpa" and v:
                text += f"\nmlxpa {ours / v:.2f}x"
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, v), ha="center",
                        va="bottom", fontsize=9)
        ax.set_ylabel(label)
        ax.set_ylim(0, max(values) * 1.3)
        ax.set_title(label)
        ax.tick_params(axis="x", labelrotation=15)
    b = axes[2]
    for name in ("mlxpa", "mlxpa-noprefix"):
        if name in last and last[name].kv_blocks_over_time:
            ts, blocks = zip(*[(0.0, 0), *last[name].kv_blocks_over_time])
            b.plot(ts, blocks, label=name)
    b.set_xlim(left=0)
    b.set_ylim(bottom=0)
    b.set_xlabel("seconds")
    b.set_ylabel("KV blocks in use")
    b.set_title("KV blocks in use over time")
    if b.get_legend_handles_labels()[0]:
        b.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def limit_line(fractions: dict[str, float], flops: ModelFlops, gemm_rate: float) -> str:
    """The "fraction of the matmul limit" line under every bench table."""
    per_system = ", ".join(f"{name} {f:.2f}" for name, f in fractions.items())
    return (f"fraction of the matmul limit: {per_system} (float32 GEMM {gemm_rate / 1e9:.1f} "
            f"GFLOP/s; {flops.prefill / 1e9:.3f} GFLOP per prompt token, "
            f"{flops.decode / 1e9:.3f} per output token)")


def limits_table(rows: list[LimitRow]) -> Table:
    """One row per phase of ``--workload limits``: achieved and limit tok/s, fraction."""
    t = Table(title="mlxpa bench: limits")
    for c in ("phase", "tokens", "seconds", "tok/s", "limit tok/s", "fraction of limit"):
        t.add_column(c, justify="right" if c != "phase" else "left")
    for r in rows:
        t.add_row(r.phase, str(r.tokens), f"{r.seconds:.2f}", f"{r.tokens_per_s:.1f}",
                  f"{r.limit_tokens_per_s:.1f}", f"{r.fraction:.2f}")
    return t
