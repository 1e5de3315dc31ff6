"""The Ray replicas' engine work without Ray (they run rows through the streaming core,
``RequestStream``): a shard's records equal what a local run writes for the same rows, and
``build_processor``'s replica gives each row its samples and an invalid row its error."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from mlxpa.batch.requests import rows_to_requests
from mlxpa.batch.run import RunOptions, run_file
from mlxpa.batch.source import Source
from mlxpa.config import EngineConfig
from mlxpa.data.validate import validate
from mlxpa.inputs import InputProcessor
from mlxpa.ray import replica
from mlxpa.ray.replica import ShardReplica
from mlxpa.ray.row_replica import RowReplica
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import save_tiny_model


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    """Outside an actor: the replica's name without asking Ray (which would start it)."""
    monkeypatch.setattr(replica, "_actor_name", lambda: "local")


ROWS = [{"id": "a", "prompt": "shared start, then one", "n": 2, "temperature": 1.0},
        {"id": "b", "prompt": "other text"},
        {"id": "c", "prompt": "shared start, then two", "max_tokens": 3}]


def test_a_shard_writes_what_a_local_run_writes(tmp_path):
    folder = save_tiny_model(tmp_path / "tiny")
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    config = EngineConfig(model=folder, kv_cache_memory_bytes=2**30 // 100)
    defaults = SamplingParams(max_tokens=6)
    out = tmp_path / "out.jsonl"
    run_file(str(src), str(out), config, defaults, RunOptions(show_progress=False))
    local = [json.loads(line) for line in out.read_text().splitlines()]
    shard_replica = ShardReplica(config, "mlxpa", "tiny", str(src), "line")
    with Source.open(str(src)) as s:
        v = validate(s.rows(), source=s.name, unit=s.unit)
        shard = list(rows_to_requests(s, v, defaults,
                                      InputProcessor(shard_replica.engine.tokenizer)))
    key, records, stats = shard_replica.run_shard(7, shard)
    assert key == 7 and [i for i, _ in records] == [0, 1, 2]
    assert [r for _, recs in records for r in recs] == local
    assert stats["requests"] == 4 and stats["failed_rows"] == 0


def test_the_processor_replica_gives_samples_and_errors(tmp_path):
    folder = save_tiny_model(tmp_path / "tiny")
    config = EngineConfig(model=folder, kv_cache_memory_bytes=2**30 // 100)
    defaults = SamplingParams(max_tokens=4)
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    run_file(str(src), str(out), config, defaults, RunOptions(show_progress=False))
    local = [json.loads(line) for line in out.read_text().splitlines()]
    row_replica = RowReplica(config, defaults, drop=("key",))
    rows = [*ROWS, {"id": "d", "prompt": "x", "temperature": -1},
            {"id": "a", "prompt": "again"}]  # a request id is unique, as in mlxpa run
    columns = ("id", "prompt", "n", "temperature", "max_tokens")  # a column per field
    table = pa.Table.from_pylist([{**{c: r.get(c) for c in columns}, "key": 1} for r in rows])
    got = row_replica(table).to_pylist()
    assert [(r["id"], r["sample_index"]) for r in got] == [("a", 0), ("a", 1), ("b", 0),
                                                           ("c", 0), ("d", 0), ("a", 0)]
    assert all("key" not in r for r in got)
    assert [(r["text"], r["completion_tokens"]) for r in got[:4]] == [
        (r["text"], r["completion_tokens"]) for r in local]
    assert got[4]["error"] == ('<dataset>: field "temperature" must be a finite number >= 0, '
                               "got -1.0")
    assert got[5]["error"] == "<dataset> id 'a': duplicate id \"a\" (first at row 0)"
