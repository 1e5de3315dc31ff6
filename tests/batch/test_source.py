"""``Source``: stdin spooled to a temporary file that is gone afterwards, a path read as it is,
and what messages call a record (``line`` for JSONL, CSV and text, also under ``--ray``; ``row``
for Parquet)."""

from __future__ import annotations

import io
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from mlxpa.batch.source import STDIN_NAME, Source, unit_of
from mlxpa.data import InputOptions


def test_stdin_is_spooled_and_removed(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"prompt": "a"}\n\n'
                                                                  b'{"prompt": "b"}\n')))
    with Source.open("-", InputOptions()) as src:
        assert src.spooled and src.name == STDIN_NAME == "<stdin>"
        assert os.path.isfile(src.path)
        rows = list(src.rows())
        assert [r.prompt for r in rows] == ["a", "b"]
        assert src.place(rows[1]) == "<stdin> line 3"  # blank lines count
    assert not os.path.exists(src.path)


def test_a_path_is_read_as_it_is_and_names_its_records(tmp_path):
    txt = tmp_path / "in.txt"
    txt.write_text("first\nsecond\n")
    with Source.open(str(txt)) as src:
        assert (src.path, src.name, src.inputs.fmt, src.unit) == (str(txt), str(txt), "txt",
                                                                    "line")
        assert src.place(list(src.rows())[1]) == f"{txt} line 2"
    assert txt.exists()
    parquet = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "x"}]), parquet)
    with Source.open(str(parquet)) as src:
        assert src.unit == "row" and src.place(next(src.rows())) == f"{parquet} row 0"
    assert [unit_of(f) for f in ("jsonl", "csv", "txt", "parquet", "hf")] == [
        "line", "line", "line", "row", "row"]
