"""Peak memory of the ``mlxpa run --ray`` driver on a large input (default 1,000,000 rows).

Writes a JSONL input of short prompts in 100 shared-prefix groups, builds a tiny random model
(``tests/tiny_models``: byte tokenizer, one token per character), runs
``python -m mlxpa run INPUT -o OUTPUT --ray`` in a subprocess with ``--max-tokens 1`` and
reads the driver's peak resident set size (``VmHWM`` in ``/proc/<pid>/status``, polled every
50 ms while it runs; the Ray processes and replicas are other processes and are not counted).
Only the CLI is used, so the same script measures any checkout: ``--repo`` names the one
whose ``mlxpa`` runs (default: this script's), e.g. the code before the driver streamed::

    git worktree add /tmp/mlxpa-old 67e469e
    python benchmarks/ray_driver_memory.py --repo /tmp/mlxpa-old --json old.json
    python benchmarks/ray_driver_memory.py --json new.json
    python benchmarks/ray_driver_memory.py --rows 2000          # a quick check

Linux only (``/proc``). Every row runs on the replicas, so a million rows take hours on a
small machine; with ``--stop-after S`` the driver gets a Ctrl-C after S seconds (it writes the
finished rows and exits 130) and the peak is the peak until then. The old driver reaches its
peak once it has tokenized every row, before the first shard runs: a stopped run measured it
only if ``rows_written`` is above 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)


def write_input(path: str, rows: int, groups: int = 100) -> None:
    """``rows`` JSONL rows: a system sentence shared by each of ``groups`` groups (rows
    interleaved, so prefix sharding has to reorder them), then a unique question."""
    with open(path, "w") as f:
        for i in range(rows):
            prompt = f"System {i % groups}: answer in one word. Question {i}?"
            f.write(json.dumps({"id": i, "prompt": prompt}) + "\n")


def vm_hwm_kib(pid: int) -> int | None:
    """The peak resident set size of process ``pid`` so far (KiB), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None  # a zombie: its memory is already released


def measure(repo: str, model: str, src: str, out: str, replicas: int,
            stop_after: float | None, extra: list[str]) -> dict:
    """Run ``mlxpa run --ray`` from ``repo`` once; the driver's peak RSS and wall time."""
    cmd = [sys.executable, "-m", "mlxpa", "run", src, "-o", out, "--model", model,
           "--max-tokens", "1", "--kv-memory", "0.05", "--ray", "--num-replicas",
           str(replicas), "--quiet", *extra]
    env = {**os.environ, "PYTHONPATH": repo}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL)
    peak, stopped = 0, False
    while proc.poll() is None:
        peak = max(peak, vm_hwm_kib(proc.pid) or 0)
        if stop_after is not None and not stopped and time.perf_counter() - start > stop_after:
            proc.send_signal(signal.SIGINT)
            stopped = True
        time.sleep(0.05)
    wall = time.perf_counter() - start
    written = 0
    if os.path.exists(out):
        with open(out, "rb") as f:
            written = sum(1 for _ in f)
    return {"driver_peak_rss_mib": round(peak / 1024, 1), "wall_s": round(wall, 1),
            "exit_code": proc.returncode, "rows_written": written, "stopped": stopped}


def commit_of(repo: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", default=HERE, help="checkout whose mlxpa runs (default: this one)")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--num-replicas", type=int, default=2)
    ap.add_argument("--stop-after", type=float, default=None,
                    help="send the driver Ctrl-C after this many seconds")
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("extra", nargs="*", help="more mlxpa run options (after --)")
    args = ap.parse_args()
    from tests.tiny_models import save_tiny_model

    repo = os.path.abspath(args.repo)
    with tempfile.TemporaryDirectory(prefix="mlxpa-ray-mem-") as tmp:
        model = save_tiny_model(os.path.join(tmp, "tiny"))
        src, out = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
        start = time.perf_counter()
        write_input(src, args.rows)
        size_mib = os.path.getsize(src) / 2**20
        print(f"input: {args.rows:,} rows, {size_mib:.1f} MiB, written in "
              f"{time.perf_counter() - start:.1f} s", file=sys.stderr)
        res = {"repo": repo, "commit": commit_of(repo), "rows": args.rows,
               "input_mib": round(size_mib, 1), "num_replicas": args.num_replicas,
               **measure(repo, model, src, out, args.num_replicas, args.stop_after,
                         args.extra)}
    print(json.dumps(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
