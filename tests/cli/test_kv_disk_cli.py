"""``--kv-cache-dir`` on ``mlxpa run`` (a pipeline of runs over files sharing a few-shot
prefix: the second run reads the prefix from disk, outputs identical, the report and
``--metrics-json`` count hits by tier), on ``mlxpa plan`` (its hits by tier are the ones the
next run reports) and ``mlxpa cache list`` / ``clear``."""

from __future__ import annotations

import json

import pytest

from mlxpa.core.disk_folder import list_files
from tests.cli.helpers import cli, write_jsonl

FEW_SHOT = "Label each review.\n" + "".join(f"Review: sample {i} was fine. Label: good\n"
                                            for i in range(4))


def _run(tiny, src, out, cache, metrics):
    r = cli("run", src, "-o", out, "--model", tiny, "--max-tokens", 4, "--kv-memory", 0.01,
            "--block-size", 8, "--kv-cache-dir", cache, "--metrics-json", metrics,
            "--overwrite")
    assert r.exit_code == 0, r.output
    return r, [json.loads(line) for line in out.read_text().splitlines()], json.loads(
        metrics.read_text())


def test_a_second_run_reads_the_shared_prefix_from_disk(tiny, tmp_path):
    cache = tmp_path / "kv"
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": FEW_SHOT + f"Review: row {i}."}
                                              for i in range(4)])
    metrics = tmp_path / "m.json"
    r1, rows1, m1 = _run(tiny, src, tmp_path / "o1.jsonl", cache, metrics)
    assert m1["disk_cached_prompt_tokens"] == 0 and m1["kv_disk"]["blocks_written"] > 0
    r2, rows2, m2 = _run(tiny, src, tmp_path / "o2.jsonl", cache, metrics)
    assert [r["text"] for r in rows2] == [r["text"] for r in rows1]
    shared = m1["kv_disk"]["blocks_written"] * 8
    assert m2["disk_cached_prompt_tokens"] == shared  # the first row's, from disk
    assert m2["cached_prompt_tokens"] == 4 * shared  # the ceiling: every row's shared part
    assert m2["kv_disk"]["blocks_read"] == shared // 8
    assert f"disk {shared})" in r2.stderr and "KV disk cache" in r2.stderr
    r = cli("cache", "list", "--kv-cache-dir", cache)
    assert r.exit_code == 0 and "tiny" in r.output and f"{shared // 8} files" in r.output
    r = cli("cache", "clear", "--kv-cache-dir", cache, "--yes")
    assert r.exit_code == 0 and f"removed {shared // 8} files" in r.output
    assert "empty" in cli("cache", "list", "--kv-cache-dir", cache).output


def test_bad_values_are_refused(tiny, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hi"}])
    r = cli("run", src, "--model", tiny, "--kv-cache-disk-gb", 0)
    assert r.exit_code == 2 and "--kv-cache-disk-gb must be a number of GiB > 0" in r.output


def _plan(tiny, src, cache):
    r = cli("plan", src, "--model", tiny, "--block-size", 8, "--max-tokens", 4,
            "--kv-cache-dir", cache, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_plan_predicts_the_hits_the_next_run_reads_from_disk(tiny, tmp_path):
    """Rows sharing the few-shot prefix, and a second file whose first rows share a longer
    prefix with the first file's: before any run nothing is on disk; after the first run,
    the plan's hits by tier are what the second run reports."""
    cache = tmp_path / "kv"
    rows = [{"prompt": FEW_SHOT + f"Review: row {i}."} for i in range(4)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    before = _plan(tiny, src, cache)
    assert before["disk_cached_prompt_tokens"] == 0
    assert not cache.exists()  # the plan creates nothing
    metrics = tmp_path / "m.json"
    _, _, m1 = _run(tiny, src, tmp_path / "o1.jsonl", cache, metrics)
    (name,) = cache.glob("*/namespace.json")
    name.unlink()  # a folder without it: the plan does not write it back
    tree = sorted((str(f), f.stat().st_mtime_ns) for f in cache.rglob("*"))
    assert _plan(tiny, src, cache)["disk_cached_prompt_tokens"] > 0
    assert sorted((str(f), f.stat().st_mtime_ns) for f in cache.rglob("*")) == tree
    assert before["cached_prompt_tokens"] == m1["cached_prompt_tokens"] > 0
    later = write_jsonl(tmp_path / "later.jsonl", [
        {"prompt": FEW_SHOT + f"Review: row {i} again, and more."} for i in range(3)])
    for path in (src, later):
        p = _plan(tiny, path, cache)
        _, _, m = _run(tiny, path, tmp_path / "o.jsonl", cache, metrics)
        assert p["disk_cached_prompt_tokens"] == m["disk_cached_prompt_tokens"] > 0, path
        assert p["cached_prompt_tokens"] == m["cached_prompt_tokens"], path
        assert p["memory_cached_prompt_tokens"] == (m["cached_prompt_tokens"]
                                                    - m["disk_cached_prompt_tokens"])
    r = cli("plan", src, "--model", tiny, "--block-size", 8, "--kv-cache-dir", cache)
    assert r.exit_code == 0 and f"disk {p['disk_cached_prompt_tokens']})" in r.stdout


@pytest.fixture(scope="module")
def hybrid_folder(tmp_path_factory):
    """A tiny Qwen 3.5 folder (recurrent gated-delta layers, full attention every second)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from tests.loader.tiny_archs import build, config
    from tests.tiny_models import byte_tokenizer

    folder = tmp_path_factory.mktemp("m") / "qwen3_5"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**config("qwen3_5"), "eos_token_id": 1}))
    mx.save_safetensors(str(folder / "model.safetensors"),
                        dict(tree_flatten(build("qwen3_5").parameters())))
    byte_tokenizer()._tokenizer.save_pretrained(str(folder))
    return str(folder)


def test_plan_counts_a_hybrid_models_disk_hits_to_a_snapshot(hybrid_folder, tmp_path):
    """A hybrid's prefix on disk ends with the recurrent snapshot after it: the plan counts
    the hits the next run reads; with the snapshot's header saying none, no hit may end
    there, in the plan as in the run."""
    cache, metrics = tmp_path / "kv", tmp_path / "m.json"
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": FEW_SHOT + f"Review: row {i}."}
                                              for i in range(4)])
    _, _, m1 = _run(hybrid_folder, src, tmp_path / "o1.jsonl", cache, metrics)
    assert m1["kv_disk"]["snapshots_written"] == 1
    p = _plan(hybrid_folder, src, cache)
    _, _, m2 = _run(hybrid_folder, src, tmp_path / "o2.jsonl", cache, metrics)
    assert p["disk_cached_prompt_tokens"] == m2["disk_cached_prompt_tokens"] > 0
    assert p["cached_prompt_tokens"] == m2["cached_prompt_tokens"]
    assert m2["kv_disk"]["snapshots_read"] == 1
    (f,) = [f for f in list_files(cache) if b'"snapshot":1' in open(f.path, "rb").read()]
    data = open(f.path, "rb").read().replace(b'"snapshot":1', b'"snapshot":0')
    with open(f.path, "wb") as fh:
        fh.write(data)
    p = _plan(hybrid_folder, src, cache)
    _, _, m3 = _run(hybrid_folder, src, tmp_path / "o3.jsonl", cache, metrics)
    assert p["disk_cached_prompt_tokens"] == m3["disk_cached_prompt_tokens"] == 0
    assert p["cached_prompt_tokens"] == m3["cached_prompt_tokens"] > 0
