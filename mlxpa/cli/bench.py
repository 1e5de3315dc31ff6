"""``mlxpa bench``: our engine against mlx-lm and static allocation, same prompts."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from mlxpa.cli.options import (
    BlasOpt,
    BlockSizeOpt,
    KernelOpt,
    KVMemoryOpt,
    MaxBatchedOpt,
    MaxNumSeqsOpt,
    ModelOpt,
    fail,
)

BENCH_EXAMPLES = """
Examples:

  mlxpa bench --workload shared-prefix --num-groups 8 --prompts-per-group 16 --json sp.json

  mlxpa bench --workload random --num-prompts 128 --input-len 320 --range-ratio 0.6

  mlxpa bench --workload file --input examples/prompts.jsonl --baselines mlxpa,mlx-lm
"""


def bench(
    workload: Annotated[str, typer.Option(help="random, shared-prefix or file.")] = "random",
    model: ModelOpt = None,
    input: Annotated[str | None, typer.Option(help="Input for --workload file.")] = None,
    num_prompts: Annotated[int, typer.Option(help="random: prompts.")] = 128,
    input_len: Annotated[int, typer.Option(help="random: mean prompt tokens.")] = 320,
    range_ratio: Annotated[float, typer.Option(help="random: length spread.")] = 0.6,
    output_len: Annotated[int, typer.Option(help="Tokens generated per prompt.")] = 64,
    num_groups: Annotated[int, typer.Option(help="shared-prefix: groups.")] = 8,
    prompts_per_group: Annotated[int, typer.Option(help="shared-prefix: prompts each.")] = 16,
    system_prompt_len: Annotated[int, typer.Option(help="shared-prefix: shared tokens.")] = 512,
    question_len: Annotated[int, typer.Option(help="shared-prefix: own tokens.")] = 64,
    seed: Annotated[int, typer.Option(help="Workload seed.")] = 0,
    baselines: Annotated[str, typer.Option(
        help="Systems to run: mlxpa, mlxpa-noprefix, mlx-lm, static.")] =
        "mlxpa,mlxpa-noprefix,mlx-lm,static",
    repeats: Annotated[int, typer.Option(help="Timed runs per system (median).")] = 1,
    block_size: BlockSizeOpt = 16,
    kv_memory: KVMemoryOpt = None,
    max_num_seqs: MaxNumSeqsOpt = 128,
    max_num_batched_tokens: MaxBatchedOpt = 2048,
    kernel: KernelOpt = "auto",
    json_path: Annotated[str | None, typer.Option("--json", help="Write figures here.")] = None,
    plot: Annotated[str | None, typer.Option(help="Write a PNG plot here.")] = None,
    blas: BlasOpt = "auto",
) -> None:
    """Time our engine against mlx-lm's batch_generate and static allocation, same prompts."""
    from rich.console import Console

    from mlxpa.bench import SYSTEMS, report, run_bench
    from mlxpa.bench import workloads as w
    from mlxpa.config import EngineConfig
    from mlxpa.data import InputError
    from mlxpa.loader.models import load_model

    console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    systems = tuple(s.strip() for s in baselines.split(",") if s.strip())
    try:
        bad = [s for s in systems if s not in SYSTEMS]
        if bad or not systems:
            raise ValueError(f"unknown system(s) {bad}; choose from {', '.join(SYSTEMS)}")
        if repeats < 1:
            raise ValueError("repeats must be >= 1")
        config = EngineConfig(model=model, block_size=block_size, kv_memory_gib=kv_memory,
                              max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens, kernel=kernel)
        mdl, tok, _ = load_model(model)
        if workload == "random":
            wl = w.random_workload(tok, num_prompts, input_len, output_len, range_ratio, seed)
        elif workload == "shared-prefix":
            wl = w.shared_prefix_workload(tok, num_groups, prompts_per_group,
                                          system_prompt_len, question_len, output_len, seed)
        elif workload == "file":
            if not input:
                raise ValueError("--workload file needs --input PATH")
            wl = w.file_workload(tok, input, output_len)
        else:
            raise ValueError(f"workload must be random, shared-prefix or file, got {workload!r}")
        console.print(f"{wl.name}: {len(wl.prompts)} prompts, {wl.num_prompt_tokens} prompt "
                      f"tokens, {wl.num_output_tokens} output tokens; systems: "
                      f"{', '.join(systems)}; repeats: {repeats}", markup=False)
        figures, last = run_bench(mdl, tok, wl, config, systems, repeats)
    except InputError as e:
        fail(console, e, 2)
    except (FileNotFoundError, ValueError) as e:
        fail(console, e, 1)
    dtype = str(mdl.model.embed_tokens.weight.dtype).split(".")[-1] if hasattr(
        mdl, "model") else "unknown"
    machine = report.machine_info(dtype)
    console.print(report.figures_table(figures, f"mlxpa bench: {wl.name}"))
    console.print(f"machine: {machine['cpu']}, {machine['cores']} cores, BLAS {machine['blas']}, "
                  f"mlx {machine['mlx']}, mlx-lm {machine['mlx_lm']}, {dtype}", markup=False)
    if "mlxpa" in figures:
        print(report.throughput_line(figures["mlxpa"]))
    workload_info = {"name": wl.name, **wl.params, "num_prompts": len(wl.prompts),
                     "prompt_tokens": wl.num_prompt_tokens,
                     "output_tokens": wl.num_output_tokens}
    if json_path:
        report.write_json(json_path, workload_info, machine, figures)
    if plot:
        report.write_plot(plot, figures, last, f"{wl.name} ({machine['blas']} BLAS)")
