"""A ``cache_salt`` column in every file format (JSONL, CSV, Parquet, OpenAI Batch bodies): read
into the row, or the row's error naming the file, its line (or row) and the field; the rows
around it are not affected."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from mlxpa.data import read_rows

RULE = "must be a non-empty string of at most 256 characters"


def test_jsonl_rows_and_openai_bodies(tmp_path):
    path = tmp_path / "in.jsonl"
    lines = [{"prompt": "a", "cache_salt": "alice"},
             {"prompt": "b", "cache_salt": ""},
             {"prompt": "c"},
             {"prompt": "d", "cache_salt": 7},
             {"custom_id": "e", "url": "/v1/completions",
              "body": {"prompt": "e", "cache_salt": "bob"}},
             {"custom_id": "f", "url": "/v1/completions",
              "body": {"prompt": "f", "cache_salt": "z" * 300}},
             {"prompt": "g", "cache_salt": None}]
    path.write_text("".join(json.dumps(o) + "\n" for o in lines))
    rows = list(read_rows(str(path)))
    assert [r.cache_salt for r in rows] == ["alice", None, None, None, "bob", None, None]
    assert [r.error for r in rows] == [
        None, f'{path} line 2: field "cache_salt" {RULE}, got ""', None,
        f'{path} line 4: field "cache_salt" {RULE}, got 7', None,
        f'{path} line 6: field "body.cache_salt" {RULE}, got a string of 300 characters', None]
    assert rows[0].as_request().cache_salt == "alice"
    assert rows[4].as_request().cache_salt == "bob"


def test_csv_cells_are_salts_as_text(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text('prompt,cache_salt\na,42\nb,\nc,"x,y"\nd,' + "q" * 257 + "\n")
    rows = list(read_rows(str(path)))
    # a CSV cell is text: "42" is a salt; an empty cell is no salt
    assert [r.cache_salt for r in rows] == ["42", None, "x,y", None]
    assert [r.error for r in rows[:3]] == [None, None, None]
    assert rows[3].error == (f'{path} line 5: field "cache_salt" {RULE}, got a string of 257 '
                             "characters")


def test_parquet_column(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", "c"], "cache_salt": ["t1", None, ""]}), path)
    rows = list(read_rows(str(path)))
    assert [r.cache_salt for r in rows] == ["t1", None, None]
    assert [r.error for r in rows] == [None, None, f'{path} row 2: field "cache_salt" {RULE}, '
                                       'got ""']
    path = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"prompt": ["a"], "cache_salt": [3]}), path)
    (row,) = read_rows(str(path))
    assert row.error == f'{path} row 0: field "cache_salt" {RULE}, got 3'
