"""The disk KV tier (``--kv-cache-dir``) on the workloads it is for.

1. ``--pipeline``: a pipeline of ``--runs`` (20) ``mlxpa run`` invocations, each over
   ``--rows`` (8) rows sharing a ``--prefix-tokens`` (4,096) few-shot prefix (the same prefix
   in every file, each row its own question), once without the tier and once with it (a
   fresh folder). Reports the wall time of each pipeline (targets: with / without at most
   0.6), each run's cached prompt tokens against the ceiling (every row's shared prefix in
   whole blocks; target: every run after the first at least 0.95 of it, with the tier), and
   whether every run's outputs are identical to the first run without the tier.
2. ``--server``: ``mlxpa serve --kv-cache-dir`` gets two requests sharing a
   ``--server-prefix-tokens`` (2,048) prefix (a prefix hits served: worth keeping), is
   stopped (SIGTERM: the tier writes back) and started again; the first request after the
   restart, with the same prefix and a new question, is timed (TTFT, streamed) against the
   same request on a server started on an empty folder (target: at most 0.5).
3. ``--block-costs``: milliseconds to compute one block's tokens (a cold prefill of the
   prefix, per block) against reading and verifying one block position from the folder
   (page cache warm, and after ``posix_fadvise(DONTNEED)`` where the OS has it).

    python benchmarks/kv_disk_tier.py --pipeline --server --block-costs \\
        --json benchmarks/results/kv_disk_tier.json
    python benchmarks/kv_disk_tier.py --pipeline --model /tmp/tiny --prefix-tokens 256 \\
        --runs 3 --rows 4                                       # a quick check of the script
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("The review says the product arrived on time and works as described. Label: "
         "positive. The review says the screen cracked within a week. Label: negative. ")


def _tokenizer(model: str | None):
    from mlxpa.config import EngineConfig
    from mlxpa.loader.models import load_tokenizer_of

    return load_tokenizer_of(EngineConfig(model=model).model)


def prefix_text(tok, n: int) -> str:
    """Few-shot text of about ``n`` tokens (cut at ``n`` token ids, decoded)."""
    text = "Label each review as positive or negative.\n"
    while len(tok.encode(text)) < n + 8:
        text += WORDS
    return tok.decode(tok.encode(text, add_special_tokens=False)[:n])


def _mlxpa(*args: str) -> list[str]:
    return [sys.executable, "-m", "mlxpa", *args]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": ROOT}


def ceiling(tok, prompts: list[str], block_size: int) -> int:
    """Cached prompt tokens if every row hit its prefix shared with the others (whole
    blocks, the last token computed)."""
    ids = [tok.encode(p) for p in prompts]
    total = 0
    for i, a in enumerate(ids):
        best = 0
        for j, b in enumerate(ids):
            if i != j:
                n = 0
                while n < min(len(a) - 1, len(b)) and a[n] == b[n]:
                    n += 1
                best = max(best, n)
        total += best // block_size * block_size
    return total


def pipeline(args, tok) -> dict:
    work = tempfile.mkdtemp(prefix="kv-disk-pipeline-")
    prefix = prefix_text(tok, args.prefix_tokens)
    files = []
    for r in range(args.runs):
        path = os.path.join(work, f"in{r}.jsonl")
        with open(path, "w") as f:
            for i in range(args.rows):
                f.write(json.dumps({"prompt": f"{prefix}\nReview: file {r}, row {i}: it is "
                                    f"{'great' if i % 2 else 'broken'}. Label:"}) + "\n")
        files.append(path)
    rows = [json.loads(line)["prompt"] for line in open(files[0])]
    top = ceiling(tok, rows, args.block_size)
    out: dict = {"runs": args.runs, "rows": args.rows, "prefix_tokens": args.prefix_tokens,
                 "ceiling_cached_tokens": top}
    cold_texts: list[list[str]] = []
    for variant in ("without", "with"):
        cache = os.path.join(work, "kv")
        shutil.rmtree(cache, ignore_errors=True)
        runs, start = [], time.perf_counter()
        for r, path in enumerate(files):
            o, m = os.path.join(work, f"out{r}.jsonl"), os.path.join(work, f"m{r}.json")
            cmd = _mlxpa("run", path, "-o", o, "--overwrite", "--metrics-json", m,
                         "--max-tokens", str(args.max_tokens), "--quiet",
                         "--block-size", str(args.block_size), *args.engine)
            if args.model:
                cmd += ["--model", args.model]
            if variant == "with":
                cmd += ["--kv-cache-dir", cache]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, env=_env(), cwd=ROOT)
            metrics = json.load(open(m))
            texts = [json.loads(line)["text"] for line in open(o)]
            if variant == "without":
                cold_texts.append(texts)
            runs.append({"wall_s": time.perf_counter() - t0,
                         "cached": metrics["cached_prompt_tokens"],
                         "disk": metrics.get("disk_cached_prompt_tokens", 0),
                         "of_ceiling": metrics["cached_prompt_tokens"] / top,
                         "texts_as_without": texts == cold_texts[r]})
            print(variant, r, runs[-1], flush=True)
        out[variant] = {"wall_s": time.perf_counter() - start, "runs": runs}
    out["wall_ratio"] = out["with"]["wall_s"] / out["without"]["wall_s"]
    out["min_of_ceiling_after_first"] = min(r["of_ceiling"] for r in out["with"]["runs"][1:])
    out["identical_outputs"] = all(r["texts_as_without"] for r in out["with"]["runs"])
    shutil.rmtree(work, ignore_errors=True)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(args, cache: str, port: int) -> subprocess.Popen:
    cmd = _mlxpa("serve", "--port", str(port), "--kv-cache-dir", cache, "--served-model-name", "m",
                 "--block-size", str(args.block_size), *args.engine)
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(cmd, env=_env(), cwd=ROOT, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not start")


def _ttft(port: int, prompt: str, max_tokens: int) -> float:
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens,
                       "stream": True, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft = None
    with urllib.request.urlopen(req, timeout=3600) as r:
        for line in r:
            if line.startswith(b"data:") and ttft is None and b'"text"' in line:
                ttft = time.perf_counter() - t0
    return ttft if ttft is not None else time.perf_counter() - t0


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(600)


def server(args, tok) -> dict:
    work = tempfile.mkdtemp(prefix="kv-disk-server-")
    prefix = prefix_text(tok, args.server_prefix_tokens)
    question = prefix + "\nReview: {}. Label:"
    out = {"prefix_tokens": args.server_prefix_tokens}
    cold_dir, warm_dir = os.path.join(work, "cold"), os.path.join(work, "warm")
    port = _free_port()
    proc = _serve(args, warm_dir, port)
    try:
        for q in ("it broke at once", "it is lovely"):  # two requests: worth keeping
            _ttft(port, question.format(q), args.max_tokens)
        _stop(proc)
        proc = _serve(args, warm_dir, port)  # restarted on the folder
        out["ttft_after_restart_s"] = _ttft(port, question.format("it was fine"),
                                            args.max_tokens)
        print("after the restart:", out, file=sys.stderr, flush=True)
        _stop(proc)
        proc = _serve(args, cold_dir, port)  # an empty folder: cold
        out["ttft_cold_s"] = _ttft(port, question.format("it was fine"), args.max_tokens)
        _stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    out["ttft_ratio"] = out["ttft_after_restart_s"] / out["ttft_cold_s"]
    shutil.rmtree(work, ignore_errors=True)
    print(out, flush=True)
    return out


def block_costs(args, tok) -> dict:
    """Compute per block (a cold prefill of the prefix) against read + verify per block."""
    from mlxpa.config import EngineConfig
    from mlxpa.core.disk_folder import list_files
    from mlxpa.engine import LLMEngine
    from mlxpa.request import EngineRequest
    from mlxpa.sampling_params import SamplingParams

    work = tempfile.mkdtemp(prefix="kv-disk-costs-")
    prompts = [prefix_text(tok, args.prefix_tokens) + f" Review {i}. Label:" for i in range(2)]
    ids = [tok.encode(p) for p in prompts]
    config = EngineConfig(model=args.model, block_size=args.block_size, kv_cache_dir=work,
                          kv_cache_memory_bytes=2**30)
    engine = LLMEngine(config)
    params = SamplingParams(max_tokens=1)
    t0 = time.perf_counter()
    list(engine.generate([EngineRequest("0", ids[0], params)]))
    prefill_s = time.perf_counter() - t0
    list(engine.generate([EngineRequest("1", ids[1], params)]))  # a hit: worth keeping
    engine.write_back()
    blocks = len(ids[0]) // args.block_size
    out = {"recompute_ms_per_block": prefill_s * 1e3 / blocks}
    files = list_files(work)
    for cache in ("warm", "cold"):
        if cache == "cold":
            if not hasattr(os, "posix_fadvise"):
                break
            for f in files:
                fd = os.open(f.path, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
        fresh = LLMEngine(config)
        t0 = time.perf_counter()
        hit = fresh.kv_cache_manager.get_computed_blocks(_request(ids[0]))
        read_s = time.perf_counter() - t0
        n = max(hit.num_tokens // args.block_size, 1)
        out[f"read_ms_per_block_{cache}"] = read_s * 1e3 / n
        out["position_file_bytes"] = sum(f.nbytes for f in files) / max(len(files), 1)
    shutil.rmtree(work, ignore_errors=True)
    print(out, flush=True)
    return out


def _request(ids):
    from mlxpa.request import Request
    from mlxpa.sampling_params import SamplingParams

    return Request("x", list(ids), SamplingParams(max_tokens=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pipeline", action="store_true")
    p.add_argument("--server", action="store_true")
    p.add_argument("--block-costs", action="store_true")
    p.add_argument("--model", default=None)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prefix-tokens", type=int, default=4096)
    p.add_argument("--server-prefix-tokens", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--engine", nargs=argparse.REMAINDER, default=[],
                   help="More engine options for every mlxpa command (last).")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    tok = _tokenizer(args.model)
    result = {}
    if args.pipeline:
        result["pipeline"] = pipeline(args, tok)
    if args.server:
        result["server"] = server(args, tok)
    if args.block_costs:
        result["block_costs"] = block_costs(args, tok)
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
