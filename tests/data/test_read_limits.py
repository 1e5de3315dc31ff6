"""The readers' limits: no format refuses a row another accepts (cell, line and string sizes;
deep nesting and huge integers), and long rows read in flat memory.

Oracles: the text written into the file (read back unchanged, in every format), Python's
``tracemalloc`` peak against the size of one row, and a CSV run written as its JSONL twin."""

from __future__ import annotations

import csv
import json
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mlxpa.data import read_rows

BIG = 137_589  # the issue's document cell
MB = 1 << 20


def _doc(n: int) -> str:
    return ("lorem ipsum, \"dolor\"\nsit amet; " * (n // 30 + 1))[:n]


def _write(path, fmt: str, rows: list[dict]) -> str:
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    else:
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=len(rows))
    return str(path)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
@pytest.mark.parametrize("size", [BIG, 24 * MB])
def test_every_format_reads_long_cells(tmp_path, fmt, size):
    rows = [{"id": "short", "prompt": "Hi"}, {"id": "long", "prompt": _doc(size)}]
    src = _write(tmp_path / f"in.{fmt}", fmt, rows)
    got = list(read_rows(src))
    assert [(r.id, r.prompt, r.error) for r in got] == [(d["id"], d["prompt"], None)
                                                         for d in rows]


def _peak(src: str) -> tuple[int, int]:
    tracemalloc.start()
    try:
        n = sum(1 for r in read_rows(src) if r.error is None)
        return n, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_long_rows_read_in_flat_memory(tmp_path, fmt):
    """Python's peak while reading 12 rows of 4 MB is about that of 2 such rows: it does not
    grow with the file (a reader holding the file or a 1,024-row batch would need 12 rows)."""
    peaks = []
    for count in (2, 12):
        rows = [{"id": str(i), "prompt": f"{i} " + _doc(4 * MB)} for i in range(count)]
        src = _write(tmp_path / f"in{count}.{fmt}", fmt, rows)
        del rows
        n, peak = _peak(src)
        assert n == count
        peaks.append(peak)
    assert peaks[1] < 1.5 * peaks[0], peaks
    assert peaks[1] < 12 * 4 * MB, peaks


def test_deep_nesting_and_huge_integers_are_row_errors(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "a", "x": ' + "[" * 200_000 + "]" * 200_000 + "}\n"
                   '{"prompt": "b", "seed": ' + "9" * 5000 + "}\n"
                   '{"prompt": "c"}\n')
    a, b, c = read_rows(str(src))
    assert a.error == f"{src} line 1: unreadable JSON (nested too deeply)"
    assert b.error.startswith(f"{src} line 2: unreadable JSON (Exceeds the limit")
    assert c.error is None
    csv_src = tmp_path / "in.csv"
    csv_src.write_text('prompt,stop_token_ids\nx,"' + "[" * 100_000 + '"\n')
    (row,) = read_rows(str(csv_src))
    assert row.error.startswith(f'{csv_src} line 2: field "stop_token_ids" must be a token id')


def test_issue_csv_runs_like_the_same_jsonl(tmp_path):
    """The issue's CSV (a short row and a 137,589-character cell) runs as its JSONL twin does:
    the long row is an error row for its token count (over the tiny model's 4,096-token
    context), the short one runs, exit 0."""
    from typer.testing import CliRunner

    from mlxpa.cli import app
    from tests.tiny_models import save_tiny_model

    model = save_tiny_model(tmp_path / "tiny")
    rows = [{"id": "s", "prompt": "Hi there", "max_tokens": 3},
            {"id": "l", "prompt": _doc(BIG), "max_tokens": 3}]
    outs = []
    for fmt in ("csv", "jsonl"):
        src, out = _write(tmp_path / f"in.{fmt}", fmt, rows), tmp_path / f"out-{fmt}.jsonl"
        r = CliRunner().invoke(app, ["run", src, "-o", str(out), "--model", model,
                                     "--kv-memory", "0.01", "-q"])
        assert r.exit_code == 0, r.output
        outs.append([json.loads(line) for line in out.read_text().splitlines()])
    csv_out, jsonl_out = outs
    assert [o["finish_reason"] for o in csv_out] == ["length", "error"]
    assert csv_out[1]["error"].endswith(f"in.csv line 3: prompt has {BIG} tokens; the limit is "
                                        "4095 (the model context (--max-model-len) holds 4096 "
                                        "tokens)")
    strip = [{k: v for k, v in o.items() if k != "error"} for o in csv_out]
    assert strip == [{k: v for k, v in o.items() if k != "error"} for o in jsonl_out]
