"""Parquet keeps one type for the ``logprobs`` and ``prompt_logprobs`` columns: row groups
whose rows ask for no alternatives (an empty ``top_logprobs`` list, which alone would infer
``list<null>``), groups whose rows ask for some, and groups without the column merge into one
file whose values read back as written."""

from __future__ import annotations

import pyarrow.parquet as pq

from mlxpa.data.parquet import ParquetSink


def entry(token: str, logprob: float, top: list[tuple[str, float]]) -> dict:
    return {"token": token, "logprob": logprob,
            "top_logprobs": [{"token": t, "logprob": v} for t, v in top]}


def test_groups_with_and_without_alternatives_merge(tmp_path):
    path = str(tmp_path / "out.parquet")
    records = [
        {"id": 0, "text": "a", "prompt_logprobs": [None, entry("x", -1.5, [])],
         "logprobs": [entry("a", -0.5, [])]},
        {"id": 1, "text": "b", "prompt_logprobs": [None, entry("y", -2.0, [("z", -0.1)])],
         "logprobs": [entry("b", -0.25, [("c", -1.0), ("d", -2.0)])]},
        {"id": 2, "text": "c"},
    ]
    sink = ParquetSink(path, row_group_size=1)
    sink.write([[r] for r in records])  # one record per row group: three schemas
    sink.close()
    table = pq.read_table(path)
    want = ("list<element: struct<token: string, logprob: double, top_logprobs: "
            "list<element: struct<token: string, logprob: double>>>>")
    assert str(table.schema.field("logprobs").type) == want
    assert str(table.schema.field("prompt_logprobs").type) == want
    rows = table.to_pylist()
    for got, wrote in zip(rows, records):
        assert got["prompt_logprobs"] == wrote.get("prompt_logprobs")
        assert got["logprobs"] == wrote.get("logprobs")
