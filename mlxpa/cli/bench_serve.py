"""``mlxpa bench serve``: OpenAI-compatible servers driven by streaming clients, same requests."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from mlxpa.bench.serve_workloads import ENDPOINTS, SERVE_WORKLOADS
from mlxpa.cli import options as opt
from mlxpa.cli import workload_options as wo
from mlxpa.data.reader_options import plural

SERVE_EXAMPLES = """\b
Examples:
  mlxpa bench serve --concurrency 1,8,16,32 --json s.json --plot s.png
  mlxpa bench serve --prompts-per-group 16 --output-len 32 \\
      --concurrency 1,16 --baselines mlx-lm-server
  mlxpa bench serve --workload random --request-rate 1,2,4 --seed 1
  mlxpa bench serve --workload file --input examples/prompts.jsonl
  mlxpa bench serve --url http://127.0.0.1:8000 --concurrency 16
"""

ServeWorkloadChoice = opt.choices("ServeWorkload", SERVE_WORKLOADS)
Endpoint = opt.choices("Endpoint", ENDPOINTS)
DEFAULT_SYSTEMS = "mlxpa,mlx-lm-server,mlxpa-offline"
WARMUP_REQUESTS, WARMUP_TOKENS = 2, 4


@opt.engine_options("model", "revision")
@wo.workload_options(num_prompts=64, input_len=320, range_ratio=0.6, output_len=32,
                     num_groups=1, prompts_per_group=48, system_prompt_len=512,
                     question_len=32)
def serve(
    workload: Annotated[ServeWorkloadChoice, typer.Option(
        help="Requests to send.")] = ServeWorkloadChoice.shared_prefix,
    engine: dict | None = None,  # --model, --revision
    input: Annotated[str | None, typer.Option(
        help="Input for --workload file (any input mlxpa run reads).")] = None,
    endpoint: Annotated[Endpoint, typer.Option(
        help="shared-prefix, random: the route (file rows pick theirs).")] = Endpoint.chat,
    shape: dict | None = None,  # the workload options (workload_options) stand here
    concurrency: Annotated[str | None, typer.Option(
        show_default=False, metavar="N,...", help="Load levels: requests in flight, "
        "comma-separated (default 1,8,16,32); with --request-rate, one cap.")] = None,
    request_rate: Annotated[str | None, typer.Option(
        metavar="X,...", help="Load levels: Poisson arrivals per second, comma-separated.")] = None,
    seed: Annotated[int, typer.Option(
        help="Seed of the prompts (level k: seed + k) and of the arrivals.")] = 0,
    baselines: Annotated[str | None, typer.Option(
        show_default=False, metavar="NAME,...", help="Systems, comma-separated: mlxpa "
        "(mlxpa serve), mlx-lm-server, mlxpa-offline (default: all).")] = None,
    url: Annotated[str | None, typer.Option(
        metavar="URL", help="Drive this running server (http://host:port) instead.")] = None,
    served_model_name: Annotated[str | None, typer.Option(
        help="--url: the model field (default: the first of GET /v1/models).")] = None,
    server_pid: Annotated[int | None, typer.Option(
        help="--url: the server's process, for its peak RSS.")] = None,
    ignore_eos: Annotated[bool, typer.Option(
        "--ignore-eos/--no-ignore-eos",
        help="Ask for max_tokens tokens (servers that take ignore_eos).")] = True,
    max_duration: Annotated[float, typer.Option(
        help="Seconds one load level may take; then it stops.")] = 900.0,
    request_timeout: Annotated[float, typer.Option(
        help="Seconds one request may take.")] = 300.0,
    server_timeout: Annotated[float, typer.Option(
        help="Seconds a server may take to answer GET /health.")] = 300.0,
    json_path: Annotated[str | None, typer.Option("--json", help="Write figures here.")] = None,
    plot: Annotated[str | None, typer.Option(
        help="Write a PNG plot of latency against throughput here.")] = None,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="No progress bars (the results are still printed).")] = False,
    blas: opt.BlasOpt = "auto",
) -> None:
    """Drive OpenAI-compatible servers (mlxpa serve, mlx_lm.server) with streaming clients at
    each load level, and run the same requests offline: throughput, TTFT, ITL and end-to-end
    latency, failures and peak RSS."""
    from mlxpa.bench.progress import BenchProgress
    from mlxpa.bench.serve_figures import token_counter
    from mlxpa.bench.serve_systems import ServeBench
    from mlxpa.cli.bench import _console
    from mlxpa.data import InputError
    from mlxpa.loader.models import load_tokenizer_of, resolve_model

    console = _console()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per request
    try:
        systems = _systems(baselines, url)
        _check_outputs(workload.value, input, json_path, plot)
        specs = load_specs(concurrency, request_rate, seed, max_duration, request_timeout)
        model = (engine or {}).get("model")
        folder = str(resolve_model(model, (engine or {}).get("revision")))
        tokenizer = load_tokenizer_of(folder)
        make = _workload_maker(workload.value, tokenizer, endpoint.value, input, shape or {})
        levels, warmup, info = _levels(make, specs, seed)
    except InputError as e:
        opt.fail(console, e, 2)
    except (FileNotFoundError, ValueError) as e:
        opt.fail(console, e, 1)
    _say_plan(console, info, levels, systems)
    with BenchProgress(console, enabled=not quiet) as progress:
        bench = ServeBench(levels, warmup, token_counter(tokenizer), ignore_eos, progress)
        if url:
            bench.drive(systems[0], url.rstrip("/"), served_model_name or _model_name(url, folder),
                        ignore_eos, server_pid)
        else:
            bench.run(systems, folder, server_timeout)
    _report(console, bench, info, specs, folder, json_path, plot)


def _systems(baselines: str | None, url: str | None) -> tuple[str, ...]:
    """The systems to run: ``--url`` alone, or the ``--baselines`` names.

    Raises:
        ValueError: Both given, a URL without a scheme, an unknown system.
    """
    from mlxpa.bench.serve_systems import SYSTEMS

    if url and baselines:
        raise ValueError("give --url (a running server) or --baselines (servers to start), "
                         "not both")
    if url:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--url must start with http:// or https://, got {url!r}")
        return (url.split("://", 1)[1].rstrip("/"),)
    systems = tuple(s.strip() for s in (baselines or DEFAULT_SYSTEMS).split(",") if s.strip())
    bad = [s for s in systems if s not in SYSTEMS]
    if bad or not systems:
        raise ValueError(f"unknown system(s) {bad}; choose from {', '.join(SYSTEMS)}")
    return systems


def _check_outputs(workload: str, input: str | None, json_path: str | None,
                   plot: str | None) -> None:
    """``--workload file`` has ``--input``; the output files can be written (and plotted)."""
    from mlxpa.cli.bench import _need_matplotlib
    from mlxpa.data._files import check_output_path

    if workload == "file" and not input:
        raise ValueError("--workload file needs --input PATH")
    if plot:
        _need_matplotlib()
    for target in (json_path, plot):
        if target:
            check_output_path(target)


def load_specs(concurrency: str | None, request_rate: str | None, seed: int,
               max_duration: float, request_timeout: float) -> list:
    """The load levels of ``--concurrency`` and ``--request-rate``.

    Raises:
        ValueError: A value that is not a positive number, or several concurrencies with
            request rates.
    """
    from mlxpa.bench.serve_load import LoadSpec

    caps = _numbers(concurrency or ("" if request_rate else "1,8,16,32"), int, "--concurrency")
    rates = _numbers(request_rate or "", float, "--request-rate")
    if rates and len(caps) > 1:
        raise ValueError("with --request-rate, --concurrency is one cap, not a list")
    kw = dict(seed=seed, max_duration_s=max_duration, request_timeout_s=request_timeout)
    if rates:
        return [LoadSpec(caps[0] if caps else None, rate, **kw) for rate in rates]
    return [LoadSpec(c, None, **kw) for c in caps]


def _numbers(text: str, kind: type, flag: str) -> list:
    values = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            value = kind(part)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise ValueError(f"{flag} takes positive numbers, comma-separated; got {part!r}")
        values.append(value)
    return values


def _workload_maker(name, tokenizer, endpoint, input, shape: dict):
    """``make(seed)`` -> the workload (a file workload is the same for every seed)."""
    from mlxpa.bench.serve_workloads import file_requests, synthetic_requests

    if name == "file":
        wl = file_requests(tokenizer, input, shape["output_len"])
        return lambda seed: wl
    return lambda seed: synthetic_requests(name, tokenizer, endpoint, **shape, seed=seed)


def _levels(make, specs, seed: int):
    """The levels (level k's prompts from ``seed + k``, so no level finds the prompts of the
    one before in a server's prefix cache), the warm-up requests (other prompts, few tokens)
    and the workload's description."""
    import dataclasses

    from mlxpa.bench.serve_systems import Level

    levels = [Level(spec, make(seed + k).requests) for k, spec in enumerate(specs)]
    first = make(seed)
    warm = [dataclasses.replace(r, row={**r.row, "max_tokens": min(WARMUP_TOKENS,
                                                                   r.max_tokens)})
            for r in make(seed + 10_000).requests[:WARMUP_REQUESTS]]
    info = {"name": first.name, **first.params, "num_requests": len(first.requests),
            "prompt_tokens": first.num_prompt_tokens, "max_output_tokens":
            first.num_output_tokens}
    return levels, warm, info


def _say_plan(console, info: dict, levels, systems) -> None:
    """Warnings about the file rows left out, then the workload and load line."""
    for key, what in (("invalid_rows", "invalid row(s)"), ("empty_rows", "row(s) with "
                      "max_tokens 0"), ("unsent_fields_rows", "row(s) whose constraint or "
                      "logprobs fields are not sent")):
        if info.get(key):
            shown = "".join(f"\n  {p}" for p in info["problems"]) if key == "invalid_rows" else ""
            console.print(f"warning: {info[key]} {what} of {info['path']}{shown}",
                          style="yellow", markup=False, highlight=False, soft_wrap=True)
    console.print(f"{info['name']}: {plural(info['num_requests'], 'request')} per level, "
                  f"{plural(info['prompt_tokens'], 'prompt token')}, at most "
                  f"{plural(info['max_output_tokens'], 'output token')}; levels: "
                  f"{', '.join(lv.spec.label for lv in levels)}; systems: {', '.join(systems)}",
                  markup=False, highlight=False)


def _model_name(url: str, folder: str) -> str:
    from mlxpa.bench.serve_systems import served_model
    from mlxpa.bench.server_process import ServerStartError

    try:
        return served_model(url.rstrip("/"))
    except ServerStartError:
        return folder


def _report(console, bench, info: dict, specs, folder: str, json_path, plot) -> None:
    """The table, the problems, vLLM's throughput lines (stdout), JSON and plot."""
    import dataclasses

    from mlxpa.bench import serve_report
    from mlxpa.bench.report import machine_info

    if bench.runs:
        console.print(serve_report.runs_table(bench.runs, f"mlxpa bench serve: {info['name']}"))
    for line in serve_report.problem_lines(bench.runs, bench.failed):
        console.print(line, style="yellow", markup=False, highlight=False, soft_wrap=True)
    if any(r.system == "mlxpa-offline" for r in bench.runs):
        console.print("mlxpa-offline: every request at once in this process; throughput only "
                      "(no latency under a concurrency there)", markup=False)
    for run in bench.runs:
        print(serve_report.throughput_line(run))
    machine = {**machine_info(weights_dtype(folder)), "model": folder}
    load = {"levels": [dataclasses.asdict(s) for s in specs]}
    if json_path:
        serve_report.write_json(json_path, info, load, machine, bench.runs, bench.failed)
    if plot and bench.runs:
        serve_report.write_plot(plot, bench.runs, f"mlxpa bench serve: {info['name']}, "
                                f"{info['num_requests']} requests per level "
                                f"({machine['cpu']}, {machine['dtype']})")
    if not bench.runs:
        raise typer.Exit(1)


def weights_dtype(folder: str) -> str:
    """The most common dtype of the model folder's safetensors weights (``F32``, ``BF16``,
    ``U32`` for packed quantized weights); ``unknown`` without weights."""
    from collections import Counter
    from pathlib import Path

    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return "unknown"
    with safe_open(str(files[0]), "numpy") as f:
        counts = Counter(f.get_slice(k).get_dtype() for k in f.keys())
    return counts.most_common(1)[0][0] if counts else "unknown"
