"""Values the writers must store whole: non-finite floats as strict JSON (null), kept empty
objects in Parquet."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest


def test_jsonl_output_is_strict_json():
    from mlxpa.utils import json_line

    line = json_line({"id": 1, "extra": [float("nan"), {"x": float("-inf")}], "y": 2**70})
    assert json.loads(line, parse_constant=lambda c: pytest.fail(c)) == {
        "id": 1, "extra": [None, {"x": None}], "y": 2**70}



def test_parquet_output_stores_kept_empty_objects(tmp_path):
    """A kept column holding {} (found by the fuzzer: --keep-columns body of an OpenAI line
    with "prompt": {}) is stored as JSON text; Arrow cannot write a struct without fields."""
    from mlxpa.data import ResultWriter

    out = tmp_path / "o.parquet"
    with ResultWriter(str(out)) as w:
        w.add(0, [{"id": "a", "text": "x", "body": {"prompt": {}, "n": [{}]}}])
        w.add(1, [{"id": "b", "text": "y", "body": {}}])
    got = pq.read_table(out).to_pylist()
    assert [json.loads(r["body"]) for r in got] == [{"prompt": {}, "n": [{}]}, {}]

