"""``mlxpa bench``: our engine against mlx-lm and static allocation, same prompts."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from mlxpa.bench.workloads import WORKLOADS
from mlxpa.cli.options import (
    BlasOpt,
    BlockSizeOpt,
    Kernel,
    KernelOpt,
    KVMemoryOpt,
    MaxBatchedOpt,
    MaxNumSeqsOpt,
    ModelOpt,
    choices,
    engine_config,
    fail,
)

BENCH_EXAMPLES = """
Examples:

  mlxpa bench --workload shared-prefix --num-groups 8 --prompts-per-group 16 --json sp.json

  mlxpa bench --workload random --num-prompts 128 --input-len 320 --range-ratio 0.6

  mlxpa bench --workload file --input examples/prompts.jsonl --baselines mlxpa,mlx-lm
"""


Workload = choices("Workload", WORKLOADS)
ALL_SYSTEMS = "mlxpa,mlxpa-noprefix,mlx-lm,static"


def bench(
    workload: Annotated[Workload, typer.Option(help="Prompts to time.")] = Workload.random,
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
        help="Systems to run: mlxpa, mlxpa-noprefix, mlx-lm, static.")] = ALL_SYSTEMS,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per system (median).")] = 1,
    block_size: BlockSizeOpt = 16,
    kv_memory: KVMemoryOpt = None,
    max_num_seqs: MaxNumSeqsOpt = 128,
    max_num_batched_tokens: MaxBatchedOpt = 2048,
    kernel: KernelOpt = Kernel.auto,
    json_path: Annotated[str | None, typer.Option("--json", help="Write figures here.")] = None,
    plot: Annotated[str | None, typer.Option(help="Write a PNG plot here.")] = None,
    blas: BlasOpt = "auto",
) -> None:
    """Time our engine against mlx-lm's batch_generate and static allocation, same prompts."""
    from rich.console import Console

    from mlxpa.bench.systems import SYSTEMS, run_bench
    from mlxpa.bench.workloads import make_workload
    from mlxpa.data import InputError
    from mlxpa.loader.models import load_model

    console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    systems = tuple(s.strip() for s in baselines.split(",") if s.strip())
    try:
        bad = [s for s in systems if s not in SYSTEMS]
        if bad or not systems:
            raise ValueError(f"unknown system(s) {bad}; choose from {', '.join(SYSTEMS)}")
        config = engine_config(model, block_size, kv_memory, max_num_seqs,
                               max_num_batched_tokens, kernel)
        mdl, tok, _ = load_model(model)
        wl = make_workload(workload.value, tok, input=input, num_prompts=num_prompts,
                           input_len=input_len, range_ratio=range_ratio, output_len=output_len,
                           num_groups=num_groups, prompts_per_group=prompts_per_group,
                           system_prompt_len=system_prompt_len, question_len=question_len,
                           seed=seed)
        console.print(f"{wl.name}: {len(wl.prompts)} prompts, {wl.num_prompt_tokens} prompt "
                      f"tokens, {wl.num_output_tokens} output tokens; systems: "
                      f"{', '.join(systems)}; repeats: {repeats}", markup=False)
        figures, last = run_bench(mdl, tok, wl, config, systems, repeats)
    except InputError as e:
        fail(console, e, 2)
    except (FileNotFoundError, ValueError) as e:
        fail(console, e, 1)
    _report(console, mdl, wl, figures, last, json_path, plot)


def _report(console, model, wl, figures: dict, last: dict, json_path: str | None,
            plot: str | None) -> None:
    """The table and throughput line, then the JSON and plot files asked for."""
    from mlxpa.bench import report
    from mlxpa.loader.models import model_dtype

    dtype = str(model_dtype(model)).split(".")[-1]
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
