"""``--kv-cache-dir`` on ``mlxpa run`` (a pipeline of runs over files sharing a few-shot
prefix: the second run reads the prefix from disk, outputs identical, the report and
``--metrics-json`` count hits by tier) and ``mlxpa cache list`` / ``clear``."""

from __future__ import annotations

import json

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
