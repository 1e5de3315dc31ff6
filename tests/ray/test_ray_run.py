"""``mlxpa run --ray`` and ``mlxpa.ray.build_processor`` on a local Ray cluster (2 CPU workers)
with a tiny model; the oracle is a local run of the same rows (itself checked against mlx-lm's
generation in tests/cli and tests/engine): same bytes on disk, same ids and error rows, same
greedy texts; for an invalid input, the same exit status and message. One test kills a
replica's worker process (SIGKILL) in the middle of the run."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a Ray cluster and model loads per replica

from typer.testing import CliRunner  # noqa: E402

from mlxpa.batch.run import RunOptions, run_file  # noqa: E402
from mlxpa.cli import app  # noqa: E402
from mlxpa.config import EngineConfig  # noqa: E402
from mlxpa.ray import build_processor  # noqa: E402
from mlxpa.ray.run import RayOptions, run_file_ray  # noqa: E402
from mlxpa.sampling_params import SamplingParams  # noqa: E402
from tests.tiny_models import STRICT_TEMPLATE, VOCAB, save_tiny_model  # noqa: E402

SYSTEMS = ["You are a terse assistant; answer in one word. " * 2,
           "Translate the following sentence into French. " * 2,
           "Summarize this text for a child of five years. " * 2]


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


@pytest.fixture(scope="module")
def strict_model(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("m") / "strict", chat_template=STRICT_TEMPLATE)


def prompts(num: int = 18) -> list[dict]:
    """``num`` rows in three prefix groups, interleaved, so prefix sharding must reorder."""
    return [{"id": f"q{i}", "prompt": SYSTEMS[i % 3] + f"Item {i}: {'xyz' * (i % 4)}?",
             "max_tokens": 6 + i % 5} for i in range(num)]


def write_rows(path, rows, extra: str = "") -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + extra)
    return str(path)


def run_cli(args, exit_code: int = 0):
    r = CliRunner().invoke(app, ["run", *args, "--kv-memory", "0.01", "-q"])
    assert r.exit_code == exit_code, r.output
    return r


def refusals(tmp_path, src: str, model: str) -> list[str]:
    """What a local run and a --ray run of ``src`` print when they refuse it (exit 2 both;
    neither writes an output)."""
    said = []
    for name, more in (("local", []), ("ray", ["--ray", "--num-replicas", "2"])):
        out = tmp_path / f"{name}-refused.jsonl"
        said.append(run_cli([src, "--model", model, "-o", str(out), *more], 2).stderr)
        assert not out.exists()
    return said


def test_ray_run_writes_what_a_local_run_writes(tmp_path, model, cluster):
    rows = prompts()
    rows[4]["n"] = 2
    rows.append({"id": "chat", "messages": [{"role": "user", "content": "hi"}]})  # no template
    src = write_rows(tmp_path / "in.jsonl", rows, '{"id": "bad", "prompt": ""}\nnot json\n')
    local_said, ray_said = refusals(tmp_path, src, model)
    assert ray_said == local_said and "3 invalid row(s) of 21" in local_said
    common = [src, "--model", model, "--skip-invalid"]
    run_cli([*common, "-o", str(tmp_path / "local.jsonl"), "--metrics-json",
             str(tmp_path / "local.json")])
    run_cli([*common, "-o", str(tmp_path / "ray.jsonl"), "--metrics-json",
             str(tmp_path / "ray.json"), "--ray", "--num-replicas", "2"])
    local = (tmp_path / "local.jsonl").read_text()
    assert (tmp_path / "ray.jsonl").read_text() == local
    out = [json.loads(line) for line in local.splitlines()]
    assert [o["id"] for o in out] == [f"q{i}" for i in range(5)] + ["q4"] + [
        f"q{i}" for i in range(5, 18)] + ["chat", "bad", None]
    assert [o["finish_reason"] for o in out[-3:]] == ["error"] * 3
    lm = json.loads((tmp_path / "local.json").read_text())
    rm = json.loads((tmp_path / "ray.json").read_text())
    for key in ("requests", "prompt_tokens", "generation_tokens", "failed_rows"):
        assert rm[key] == lm[key], key
    assert lm["failed_rows"] == 3 and rm["num_replicas"] == 2
    assert isinstance(rm["peak_kv_blocks"], list) and len(rm["peak_kv_blocks"]) == 2
    assert rm["prefix_cache_hit_rate"] >= 0.95 * lm["prefix_cache_hit_rate"] > 0.5


def test_ray_refuses_what_a_local_run_refuses_before_the_model_loads(tmp_path, strict_model,
                                                                    cluster):
    """A chat row the template rejects and a stop id outside the vocabulary stop both runs
    before any model work, with the same exit status (2) and the same message."""
    rows = [{"id": "ok", "prompt": "hi"},
            {"id": "robot", "messages": [{"role": "robot", "content": "hi"}]},
            {"id": "oov", "prompt": "hi", "stop_token_ids": [VOCAB + 3]}]
    src = write_rows(tmp_path / "in.jsonl", rows)
    local_said, ray_said = refusals(tmp_path, src, strict_model)
    assert ray_said == local_said
    said = " ".join(local_said.split())  # rich wraps the long lines
    assert "2 invalid row(s) of 3" in said
    assert (f'{src} line 2: field "messages": the chat template rejected them: unknown role '
            "robot") in said
    assert (f'{src} line 3: field "stop_token_ids": token id {VOCAB + 3} is outside the '
            f"model's vocabulary ({VOCAB} ids, 0..{VOCAB - 1})") in said


def test_split_special_tokens_gives_the_same_ids_locally_and_on_ray(tmp_path, model, cluster):
    """``a<eos>b`` is 3 tokens (a, <eos>, b), and 7 with --split-special-tokens (a, <, e, o,
    s, >, b): on the replicas as locally."""
    src = write_rows(tmp_path / "in.jsonl", [{"id": "s", "prompt": "a<eos>b", "max_tokens": 2},
                                             *prompts(3)])
    for name, more in (("local", []), ("ray", ["--ray", "--num-replicas", "2"])):
        run_cli([src, "--model", model, "-o", str(tmp_path / f"{name}.jsonl"),
                 "--split-special-tokens", *more])
    local = (tmp_path / "local.jsonl").read_text()
    assert (tmp_path / "ray.jsonl").read_text() == local
    assert json.loads(local.splitlines()[0])["prompt_tokens"] == 7


def test_ray_resume_appends_the_missing_rows(tmp_path, model, cluster):
    src = write_rows(tmp_path / "in.jsonl", prompts(10))
    full = tmp_path / "full.jsonl"
    run_cli([src, "--model", model, "-o", str(full)])
    lines = full.read_text().splitlines(keepends=True)
    for name in ("local.jsonl", "ray.jsonl"):  # rows 0, 1, 3, 4 (2 was running), a torn line
        (tmp_path / name).write_text("".join(lines[:2] + lines[3:5]) + lines[5][:15])
    run_cli([src, "--model", model, "-o", str(tmp_path / "local.jsonl"), "--resume"])
    run_cli([src, "--model", model, "-o", str(tmp_path / "ray.jsonl"), "--ray",
             "--num-replicas", "2", "--resume"])
    local = (tmp_path / "local.jsonl").read_text()
    assert (tmp_path / "ray.jsonl").read_text() == local
    # cached_tokens depend on which rows ran together; everything else is the full run's,
    # in input order again
    strip = [{k: v for k, v in json.loads(line).items() if k != "cached_tokens"}
             for line in local.splitlines()]
    assert strip == [{k: v for k, v in json.loads(line).items() if k != "cached_tokens"}
                     for line in lines]


def test_build_processor_matches_a_local_run(tmp_path, model, cluster):
    rows = prompts(12)
    run_file(write_rows(tmp_path / "in.jsonl", rows), str(tmp_path / "local.jsonl"),
             EngineConfig(model=model, kv_cache_memory_bytes=2**30 // 100), SamplingParams(),
             RunOptions(show_progress=False))
    want = {o["id"]: o["text"] for o in map(json.loads, open(tmp_path / "local.jsonl"))}
    items = [{"key": r["id"], "question": r["prompt"], "limit": r["max_tokens"]} for r in rows]
    items.append({"key": "neg", "question": "x", "limit": -1})
    processor = build_processor(
        EngineConfig(model=model, kv_cache_memory_bytes=2**30 // 100),
        preprocess=lambda r: {"id": r["key"], "prompt": r["question"],
                              "max_tokens": r["limit"]},
        postprocess=lambda r: {"key": r["id"], "answer": r["text"], "error": r["error"]},
        num_replicas=2, batch_size=4, cpus_per_replica=0.5)  # a CPU left for the sort
    got = processor(ray.data.from_items(items)).take_all()
    assert sorted(g["key"] for g in got) == sorted(r["key"] for r in items)
    assert {g["key"]: g["answer"] for g in got if g["key"] != "neg"} == want
    bad = next(g for g in got if g["key"] == "neg")
    assert bad["answer"] is None and 'field "max_tokens"' in bad["error"]


def without_cached(path) -> list[dict]:
    with open(path) as f:
        return [{k: v for k, v in json.loads(line).items() if k != "cached_tokens"}
                for line in f]


def replica_pids() -> dict[int, str]:
    """Ray worker processes of ShardReplica actors, by pid: their process titles (Ray adds
    the method running, ``.run_shard``)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if title.startswith("ray::ShardReplica"):
            found[int(pid)] = title.strip()
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds Ray workers through /proc")
def test_a_killed_replica_loses_and_duplicates_no_row(tmp_path, model, cluster):
    src = write_rows(tmp_path / "in.jsonl", prompts(16))
    defaults = SamplingParams(max_tokens=120, ignore_eos=True)
    config = EngineConfig(model=model, kv_cache_memory_bytes=2**30 // 100)
    quiet = RunOptions(show_progress=False)
    run_file(src, str(tmp_path / "local.jsonl"), config, defaults, quiet)
    killed: list[int] = []
    seen: set[int] = set()  # replica processes alive when one was killed

    def kill_a_busy_replica() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            busy = [p for p, t in replica_pids().items() if t.endswith(".run_shard")]
            if busy:
                seen.update(replica_pids())
                os.kill(busy[0], signal.SIGKILL)
                killed.append(busy[0])
            time.sleep(0.02)

    killer = threading.Thread(target=kill_a_busy_replica)
    killer.start()
    metrics = run_file_ray(src, str(tmp_path / "ray.jsonl"), config, defaults, quiet,
                           RayOptions(num_replicas=2, shard_rows=2))
    killer.join()
    assert killed, "no replica was seen running a shard"
    got, want = (without_cached(tmp_path / n) for n in ("ray.jsonl", "local.jsonl"))
    # cached_tokens: the restarted replica starts with an empty prefix cache
    assert len(got) == 16 and got == want
    pids = {int(p.rsplit(":", 1)[1]) for p in metrics["replica_processes"]}
    assert pids - seen, "no restarted replica process ran a shard"
    assert metrics["requests"] == 16
