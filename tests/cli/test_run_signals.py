"""``mlxpa run`` in a subprocess on a tiny model, stopped part-way: SIGKILL then ``--resume``
(exactly one row per input id, none torn), and SIGINT (exit 130, the resume command printed,
and that command finishes the job); a resume that is itself interrupted leaves a valid,
resumable file. The finished output equals an uninterrupted run's byte for byte (input order
restored at the end of the resume; greedy, so the texts are the same)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tiny_models import save_tiny_model

NUM_ROWS = 120


def max_tokens(i: int) -> int:
    """Every 4th row is long, so later rows finish first: an interrupt finds finished rows
    after a row still running, and writes them after the gap (out of input order)."""
    return 48 if i % 4 == 0 else 8
pytestmark = [pytest.mark.slow,  # subprocess runs, each loading the model
              pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """``(tiny model folder, input path, input ids)``."""
    root = tmp_path_factory.mktemp("sig")
    folder = save_tiny_model(root / "tiny")
    src = root / "in.jsonl"
    ids = [f"r{i}" for i in range(NUM_ROWS)]
    src.write_text("".join(json.dumps({"id": rid, "prompt": f"row {i} of the job",
                                       "max_tokens": max_tokens(i)}) + "\n"
                           for i, rid in enumerate(ids)))
    return folder, str(src), ids


@pytest.fixture(scope="module")
def reference(job, tmp_path_factory) -> bytes:
    """The output of the same run, never interrupted."""
    folder, src, ids = job
    out = str(tmp_path_factory.mktemp("ref") / "out.jsonl")
    r = subprocess.run(mlxpa(*run_args(folder, src, out)), capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    assert output_ids(out) == ids
    return Path(out).read_bytes()


def mlxpa(*args: str) -> list[str]:
    return [sys.executable, "-m", "mlxpa", *args]


def run_args(folder: str, src: str, out: str) -> list[str]:
    return ["run", src, "-o", out, "--model", folder, "--ignore-eos",
            "--max-num-seqs", "4", "--kv-memory", "0.01", "--order", "input", "-q"]


def wait_for_lines(path: str, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()
        if os.path.exists(path) and Path(path).read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"no {n} lines in {path} after {timeout} s")


def output_ids(path: str) -> list[str]:
    data = Path(path).read_text(encoding="utf-8")
    assert data.endswith("\n")
    rows = [json.loads(line) for line in data.splitlines()]  # every line whole
    assert all(r["finish_reason"] == "length"
               and r["completion_tokens"] == max_tokens(int(r["id"][1:])) for r in rows)
    return [r["id"] for r in rows]


def test_sigkill_then_resume(job, reference, tmp_path):
    folder, src, ids = job
    out = str(tmp_path / "out.jsonl")
    proc = subprocess.Popen(mlxpa(*run_args(folder, src, out)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    wait_for_lines(out, 8, proc)
    proc.kill()
    proc.wait(30)
    done = Path(out).read_bytes().count(b"\n")
    assert 8 <= done < NUM_ROWS
    with open(out, "a") as f:
        f.write('{"id": "r999", "text": "torn by the')  # as if killed inside a write
    r = subprocess.run(mlxpa(*run_args(folder, src, out), "--resume"), capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    assert output_ids(out) == ids  # in input order again
    assert Path(out).read_bytes() == reference


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_sigint_writes_finished_rows_and_prints_the_resume_command(job, reference, tmp_path,
                                                                   sig):
    folder, src, ids = job
    out = str(tmp_path / "out.jsonl")
    proc = subprocess.Popen(mlxpa(*run_args(folder, src, out)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    wait_for_lines(out, 8, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    err = err.decode()
    assert proc.returncode == 130, err
    first = output_ids(out)
    assert first != ids[:len(first)]  # rows after a gap: the resume must restore the order
    assert 8 <= len(first) < NUM_ROWS and len(first) == len(set(first))
    command = next(line.strip() for line in err.splitlines() if line.strip().startswith(
        "mlxpa run"))
    assert f"interrupted: finished rows are in {out}; to run the rest:" in err
    assert command == shlex.join(["mlxpa", *run_args(folder, src, out), "--resume"])
    r = subprocess.run(mlxpa(*shlex.split(command)[1:]), capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    assert output_ids(out) == ids and Path(out).read_bytes() == reference


def interrupt(args: list[str], out: str, lines: int) -> None:
    """Run ``mlxpa args``, send SIGINT once ``out`` has ``lines`` lines, expect exit 130."""
    proc = subprocess.Popen(mlxpa(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for_lines(out, lines, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()


def test_interrupted_resume_stays_resumable_and_ends_in_input_order(job, reference, tmp_path):
    folder, src, ids = job
    out = str(tmp_path / "out.jsonl")
    interrupt(run_args(folder, src, out), out, 8)
    os.chmod(out, 0o640)
    first = Path(out).read_bytes()
    assert output_ids(out) != ids[:first.count(b"\n")]  # rows after a gap
    # The resume is interrupted too: its rows are appended after the first run's, unsorted.
    interrupt([*run_args(folder, src, out), "--resume"], out, first.count(b"\n") + 8)
    second = output_ids(out)
    assert Path(out).read_bytes().startswith(first)
    assert len(second) == len(set(second)) and set(second) < set(ids)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    r = subprocess.run(mlxpa(*run_args(folder, src, out), "--resume"), capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    assert output_ids(out) == ids and Path(out).read_bytes() == reference
    assert os.stat(out).st_mode & 0o777 == 0o640  # the rewrite keeps the file's mode


def test_signal_before_any_row_runs_stops_at_once():
    """Ctrl-C while the input is read or the model loads raises at once (nothing to write);
    once rows run (``should_stop`` polled), the first signal only asks to stop."""
    from mlxpa.cli.signals import catch_sigint

    with catch_sigint() as stop, pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    assert stop.is_set()
    with catch_sigint() as stop:
        assert not stop.should_stop()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        assert stop.should_stop()


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_sigint_before_the_first_row_finishes_leaves_no_output(job, tmp_path, ext):
    """Ctrl-C once rows run but before one finishes: no output is left behind (it was an empty
    file that a plain rerun refused, "exists; pass --resume ..."), the message says nothing
    was written, and the plain command runs again."""
    folder, _, _ = job
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"row {i}"}) + "\n"
                           for i in range(4)))
    out = str(tmp_path / f"out.{ext}")
    args = ["run", str(src), "-o", out, "--model", folder, "--ignore-eos", "--kv-memory", "0.01"]
    proc = subprocess.Popen(mlxpa(*args, "--max-tokens", "4000"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:  # the pool line: the engine is built, rows run next
        seen.append(line)
        if line.startswith("KV pool:"):
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
            break
    _, err = proc.communicate(timeout=60)
    err = "".join(seen) + err
    assert proc.returncode == 130, err
    assert "interrupted (Ctrl-C): writing the finished rows" in err  # rows were running
    assert f"interrupted before any row finished; nothing was written to {out}" in err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]  # no output, no parts folder
    r = subprocess.run(mlxpa(*args, "--max-tokens", "2", "-q"), capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    assert os.path.isfile(out)
