"""``mlxpa bench``: our engine against mlx-lm and static allocation, same prompts."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
from rich.console import Console

from mlxpa.bench.text_workloads import TEXT_NAMES
from mlxpa.bench.workloads import WORKLOADS
from mlxpa.cli import options as opt
from mlxpa.cli import workload_options as wo
from mlxpa.data.reader_options import plural

BENCH_EXAMPLES = """\b
Examples:
  mlxpa bench --workload shared-prefix --num-groups 8 \\
      --prompts-per-group 16 --json sp.json --plot sp.png
  mlxpa bench --workload random --num-prompts 128 --input-len 320
  mlxpa bench --workload shared-prefix --num-groups 4 --prompts-per-group 32 \\
      --system-prompt-len 4096 --question-len 64 --output-len 64 \\
      --baselines mlxpa,mlxpa-nocascade,mlx-lm
  mlxpa bench --workload file --input examples/prompts.jsonl \\
      --baselines mlxpa,mlx-lm
  mlxpa bench --workload annotation --num-prompts 128 --baselines mlxpa
  mlxpa bench --workload long-document --num-prompts 16 --input-len 8192 \\
      --output-len 256 --baselines mlxpa,mlx-lm
  mlxpa bench --workload long-document --questions 5 --baselines mlxpa
  mlxpa bench --workload copy-heavy --num-prompts 24 \\
      --speculative-config "$SPEC" --baselines mlxpa,mlxpa-nospec
  mlxpa bench --workload limits
  mlxpa bench serve --concurrency 1,16 --baselines mlx-lm-server
"""

LIMITS = "limits"
Workload = opt.choices("Workload", (*WORKLOADS, LIMITS))
ALL_SYSTEMS = "mlxpa,mlxpa-noprefix,mlx-lm,static"  # mlxpa-nocascade, mlxpa-nospec on request


# The engine options bench takes (its --seed is the workload's).
BENCH_ENGINE = ("model", "revision", "adapter_path", "keep_quantized", "dtype", "block_size",
                "kv_cache_memory_bytes", "max_num_seqs", "max_num_batched_tokens",
                "attention_backend", "kv_cache_dtype", "kv_group_size", "disable_cascade_attn",
                "speculative_config", "kv_cache_dir", "kv_cache_disk_gb")


@opt.engine_options(*BENCH_ENGINE)
@wo.workload_options(num_prompts=128, input_len=320, range_ratio=0.6, output_len=64,
                     num_groups=8, prompts_per_group=16, system_prompt_len=512,
                     question_len=64)
def bench(
    ctx: typer.Context,
    workload: Annotated[Workload, typer.Option(
        metavar="NAME", help="Prompts to time: random, shared-prefix, annotation, "
        "long-document, file, limits; or text, whose rows end at a stop string or EOS: "
        f"{', '.join(TEXT_NAMES)}.")] = Workload.random,
    engine: dict | None = None,  # the engine options (BENCH_ENGINE) stand here
    input: Annotated[str | None, typer.Option(help="Input for --workload file.")] = None,
    shape: dict | None = None,  # the workload options (workload_options) stand here
    questions: Annotated[int, typer.Option(
        min=0, max=5, help="long-document: typed questions per document instead of a "
        "summary (0: a summary of --output-len tokens).")] = 0,
    seed: Annotated[int, typer.Option(min=0, help="Workload seed.")] = 0,
    baselines: Annotated[str, typer.Option(
        show_default=False, help="Systems to run, comma-separated: mlxpa, mlxpa-noprefix, "
        "mlxpa-nocascade, mlxpa-nospec (speculative decoding off), mlx-lm, static (default: "
        "all but mlxpa-nocascade and mlxpa-nospec).")] = ALL_SYSTEMS,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per system (median).")] = 1,
    json_path: Annotated[str | None, typer.Option("--json", help="Write figures here.")] = None,
    plot: Annotated[str | None, typer.Option(help="Write a PNG plot here.")] = None,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="No progress bars (the results are still printed).")] = False,
    blas: opt.BlasOpt = "auto",
) -> None:
    """Time our engine against mlx-lm's batch_generate and static allocation, same prompts.
    With --workload limits: mlxpa's prefill and decode against the matmul limit instead.
    mlxpa bench serve: servers under streaming clients (see its --help)."""
    if ctx.invoked_subcommand is not None:
        return _no_options_before(ctx)
    from mlxpa.batch.model_meta import ModelMeta
    from mlxpa.bench.progress import BenchProgress
    from mlxpa.bench.systems import SYSTEMS, run_bench
    from mlxpa.bench.workloads import make_workload
    from mlxpa.data import InputError
    from mlxpa.loader.models import load_model

    console = _console()
    config = opt.checked_engine_config(engine)
    try:
        systems = _check_options(baselines, SYSTEMS, workload.value, input, json_path, plot)
        files = ModelMeta(config)  # the tokenizer loads once, before the weights
        if workload.value != LIMITS:  # the prompts are checked before the model loads
            wl = make_workload(
                workload.value, files.tokenizer(), input=input,
                **(shape or {}), questions=questions, seed=seed,
                vocab_size=files.vocab_size())
            _say_workload(console, wl, systems, repeats)
        mdl, tok, _ = load_model(config, tokenizer=files.tokenizer())
        if workload.value == LIMITS:
            return _limits(console, mdl, tok, config, repeats, json_path)
        with BenchProgress(console, enabled=not quiet) as progress:
            figures, last = run_bench(mdl, tok, wl, config, systems, repeats, progress=progress)
    except InputError as e:
        opt.fail(console, e, 2)
    except (FileNotFoundError, ValueError) as e:
        opt.fail(console, e, 1)
    _report(console, mdl, wl, figures, last, json_path, plot)


def _no_options_before(ctx: typer.Context) -> None:
    """``mlxpa bench OPTION serve``: refused (the options before a subcommand are the offline
    bench's, which does not run)."""
    given = [p.opts[0] for p in ctx.command.params  # Typer vendors click: compare by name
             if getattr(ctx.get_parameter_source(p.name), "name", None) == "COMMANDLINE"]
    if given:
        raise typer.BadParameter(f"{', '.join(given)} before {ctx.invoked_subcommand!r} is an "
                                 f"option of the offline bench; give the options of "
                                 f"{ctx.invoked_subcommand!r} after it")
def _console() -> Console:
    """The stderr console (full width on a terminal), with log lines going to stderr too."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    return Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def _check_options(baselines: str, known, workload: str, input: str | None,
                   json_path: str | None, plot: str | None) -> tuple[str, ...]:
    """Everything about the options that can fail, before minutes of benchmark; returns the
    systems ``--baselines`` names.

    Raises:
        ValueError: An unknown system, ``--workload file`` without ``--input``, a missing
            plotting extra, an output path whose folder does not exist.
    """
    from mlxpa.data._files import check_output_path

    systems = tuple(s.strip() for s in baselines.split(",") if s.strip())
    bad = [s for s in systems if s not in known]
    if bad or not systems:
        raise ValueError(f"unknown system(s) {bad}; choose from {', '.join(known)}")
    if plot:
        _need_matplotlib()
    for target in (json_path, plot):
        if target:
            check_output_path(target)
    if workload == "file" and not input:
        raise ValueError("--workload file needs --input PATH")
    return systems


def _say_workload(console, wl, systems: tuple[str, ...], repeats: int) -> None:
    """The workload line, after warnings naming the invalid rows a file workload skipped and
    counting the rows with nothing to time."""
    skipped = wl.params.get("invalid_rows", 0)
    if skipped:
        shown = "".join(f"\n  {p}" for p in wl.params["problems"])
        more = skipped - len(wl.params["problems"])
        console.print(f"warning: skipped {skipped} invalid row(s) of {wl.params['path']} "
                      f"(mlxpa run refuses them):{shown}"
                      + (f"\n  ... and {more} more" if more > 0 else ""),
                      style="yellow", markup=False, highlight=False, soft_wrap=True)
    empty = wl.params.get("empty_rows", 0)
    if empty:
        console.print(f"warning: left out {empty} row(s) of {wl.params['path']} with "
                      "max_tokens 0 (nothing to time)", style="yellow", markup=False,
                      highlight=False, soft_wrap=True)
    console.print(f"{wl.name}: {plural(len(wl.prompts), 'prompt')}, "
                  f"{plural(wl.num_prompt_tokens, 'prompt token')}, "
                  f"{'' if wl.exact_lengths else 'at most '}"
                  f"{plural(wl.num_output_tokens, 'output token')}; systems: "
                  f"{', '.join(systems)}; repeats: {repeats}", markup=False, highlight=False)


def _report(console, model, wl, figures: dict, last: dict, json_path: str | None,
            plot: str | None) -> None:
    """The table and throughput line, then the JSON and plot files asked for."""
    from mlxpa.bench import report
    from mlxpa.bench.flops import model_flops
    from mlxpa.bench.limits import gemm_flops_per_s, limit_fraction
    from mlxpa.loader.models import model_dtype

    dtype = str(model_dtype(model)).split(".")[-1]
    machine = report.machine_info(dtype)
    flops, rate = model_flops(model), gemm_flops_per_s()
    machine["gemm_flops_per_s"] = rate
    fractions = {}
    for name, f in figures.items():
        f["matmul_limit_fraction"] = fractions[name] = limit_fraction(
            f, wl.num_prompt_tokens, len(wl.prompts), flops, rate)
    console.print(report.figures_table(figures, f"mlxpa bench: {wl.name}"))
    console.print(report.limit_line(fractions, flops, rate), markup=False)
    for line in (report.cascade_line(figures), report.speculation_line(figures)):
        if line is not None:
            console.print(line, markup=False)
    console.print(f"machine: {machine['cpu']}, {machine['cores']} cores, BLAS {machine['blas']}, "
                  f"mlx {machine['mlx']}, mlx-lm {machine['mlx_lm']}, {dtype}", markup=False)
    if "mlxpa" in figures:
        print(report.throughput_line(figures["mlxpa"]))
    workload_info = {"name": wl.name, **wl.params, "num_prompts": len(wl.prompts),
                     "prompt_tokens": wl.num_prompt_tokens,
                     "output_tokens": wl.num_output_tokens,  # the most, unless exact
                     "exact_output_lens": wl.exact_lengths}
    if json_path:
        report.write_json(json_path, workload_info, machine, figures)
    if plot:
        most = "" if wl.exact_lengths else "at most "
        report.write_plot(plot, figures, last, f"mlxpa bench: {wl.name}, {len(wl.prompts)} "
                          f"prompts, {wl.num_prompt_tokens} prompt + {most}"
                          f"{wl.num_output_tokens} output tokens (BLAS: {machine['blas']}, "
                          f"{dtype})")


def _need_matplotlib() -> None:
    """Raise ``ValueError`` naming the extra to install when matplotlib is missing."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError("--plot needs matplotlib: pip install 'mlxpa[bench]' (or drop --plot)")


def _limits(console, model, tokenizer, config, repeats: int, json_path: str | None) -> None:
    """``--workload limits``: the GEMM rate, the model's FLOPs per token, mlxpa's prefill and
    decode rates against the limit (table on stderr, JSON when asked)."""
    import json

    from mlxpa.bench import report
    from mlxpa.bench.flops import model_flops
    from mlxpa.bench.limits import gemm_flops_per_s, run_limits
    from mlxpa.loader.models import model_dtype

    flops, rate = model_flops(model), gemm_flops_per_s()
    rows = run_limits(model, tokenizer, config, flops, rate, repeats)
    machine = report.machine_info(str(model_dtype(model)).split(".")[-1])
    console.print(report.limits_table(rows))
    console.print(f"float32 GEMM 2048^3: {rate / 1e9:.1f} GFLOP/s; "
                  f"{flops.prefill / 1e9:.3f} GFLOP per prefill token (no LM head), "
                  f"{flops.decode / 1e9:.3f} GFLOP per decode token; machine: {machine['cpu']}, "
                  f"BLAS {machine['blas']}", markup=False)
    for r in rows:
        print(f"{r.phase}: {r.tokens_per_s:.1f} tok/s, {r.fraction:.2f} of the matmul limit "
              f"({r.limit_tokens_per_s:.1f} tok/s)")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"machine": {**machine, "gemm_flops_per_s": rate},
                       "flops_per_token": {"prefill": flops.prefill, "decode": flops.decode},
                       "phases": {r.phase: {"tokens": r.tokens, "seconds": r.seconds,
                                            "tokens_per_s": r.tokens_per_s,
                                            "limit_tokens_per_s": r.limit_tokens_per_s,
                                            "fraction": r.fraction} for r in rows}},
                      f, indent=2)
