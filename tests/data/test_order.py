"""An ordered ``--resume`` puts the whole output back in input order (no model): the rows an
earlier run wrote (placed by id) and the rows the resumed run appends (placed by the index they
were added with), each JSONL line byte for byte, the file's mode kept; a stopped or interrupted
resume leaves a valid, resumable file. The oracle is the expected order written out by hand."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from mlxpa.data import ResultWriter
from mlxpa.data.order import jsonl_in_order
from mlxpa.data.parquet import parts_dir


def record(i, **extra) -> dict:
    return {"id": i, "text": f"t{i}", "finish_reason": "stop", "prompt_tokens": 1,
            "completion_tokens": 1, "cached_tokens": 0, **extra}


def line(rec: dict) -> str:
    return json.dumps(rec, ensure_ascii=False) + "\n"


# Input rows 0..7 have ids r0..r7, except row 7, a duplicate of r0 (an error row).
IDS = [f"r{i}" for i in range(7)] + ["r0"]


def interrupted_output(path) -> dict[str, int]:
    """What an interrupted ordered run leaves: rows 0, 1, then 3 and 5 (which finished while
    row 2 was still running), and a line whose id is not in the input. Returns the done ids."""
    path.write_text(line(record("r0")) + line(record("r1")) + line(record("r3", text="é\n"))
                    + line(record("gone")) + line(record("r5")), encoding="utf-8")
    return {"r0": 0, "r1": 1, "r3": 3, "r5": 5}


def resume(path, done, stop_after=None, **kw) -> ResultWriter:
    """The resumed run: skips the done rows, adds 2, 4, 6 and row 7's error (in that order:
    a real run adds rows as they finish)."""
    w = ResultWriter(str(path), append=True, positions=done, **kw)
    for i, rid in enumerate(IDS):
        if rid in done and i == done[rid]:
            w.skip(i)
    for n, i in enumerate([6, 2, 7, 4]):
        if n == stop_after:
            break
        w.add(i, record(IDS[i], error="dup") if i == 7 else record(IDS[i]))
    return w


EXPECTED = [record("r0"), record("r1"), record("r2"), record("r3", text="é\n"), record("r4"),
            record("r5"), record("r6"), record("r0", error="dup"), record("gone")]


def test_jsonl_resume_is_rewritten_in_input_order_with_its_mode(tmp_path):
    out = tmp_path / "out.jsonl"
    done = interrupted_output(out)
    os.chmod(out, 0o640)
    resume(out, done).close()
    assert out.read_text(encoding="utf-8") == "".join(map(line, EXPECTED))
    assert os.stat(out).st_mode & 0o777 == 0o640
    assert sorted(os.listdir(tmp_path)) == ["out.jsonl"]  # no temporary file left


def test_jsonl_stopped_or_interrupted_resume_stays_resumable(tmp_path):
    out = tmp_path / "out.jsonl"
    done = interrupted_output(out)
    before = out.read_text(encoding="utf-8")
    resume(out, done, stop_after=2).close(reorder=False)  # stopped after rows 6 and 2 ran
    after_stop = before + line(record("r2")) + line(record("r6"))
    assert out.read_text(encoding="utf-8") == after_stop
    done.update(r2=2, r6=6)
    with pytest.raises(KeyboardInterrupt), ResultWriter(str(out), append=True,
                                                        positions=done) as w:
        w.skip(0), w.skip(1), w.skip(2), w.skip(3)
        w.add(7, record("r0", error="dup"))  # row 4 still running
        raise KeyboardInterrupt  # a second Ctrl-C: closed as interrupted, never sorted
    assert out.read_text(encoding="utf-8") == after_stop + line(record("r0", error="dup"))
    # The next resume runs what is left (row 4; the duplicate's error line is dropped by
    # read_existing and written again: here it is kept, as if it were a finished row) and
    # sorts every line, the lines of earlier runs by their id.
    w = ResultWriter(str(out), append=True, positions=done)
    w.skip(0), w.skip(1), w.skip(2), w.skip(3)
    w.add(4, record("r4"))
    w.close()
    got = out.read_text(encoding="utf-8").splitlines(keepends=True)
    assert got == [line(r) for r in [record("r0"), record("r0", error="dup"), record("r1"),
                                     record("r2"), record("r3", text="é\n"), record("r4"),
                                     record("r5"), record("r6"), record("gone")]]


def test_jsonl_in_order_output_is_not_rewritten(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text(line(record("r0")) + line(record("r1")))
    inode = os.stat(out).st_ino
    w = ResultWriter(str(out), append=True, positions={"r0": 0, "r1": 1})
    w.skip(0), w.skip(1)
    w.add(2, record("r2"))
    w.close()
    assert os.stat(out).st_ino == inode
    assert out.read_text() == "".join(line(record(f"r{i}")) for i in range(3))


def test_unordered_resume_is_left_as_written_and_stale_rewrite_removed(tmp_path):
    out = tmp_path / "out.jsonl"
    done = interrupted_output(out)
    before = out.read_text(encoding="utf-8")
    stale = tmp_path / ".out.jsonl.abc123.tmp"  # a rewrite killed by SIGKILL
    stale.write_text("half")
    resume(out, done, ordered=False).close()
    assert not stale.exists()
    assert out.read_text(encoding="utf-8") == before + "".join(
        line(record(IDS[i], error="dup") if i == 7 else record(IDS[i])) for i in [6, 2, 7, 4])


def test_jsonl_in_order_refuses_a_file_it_does_not_know(tmp_path):
    out = tmp_path / "out.jsonl"
    text = line(record("r1")) + line(record("r0")) + line(record("r2"))
    out.write_text(text)
    base_end = len(line(record("r1")))
    assert not jsonl_in_order(str(out), {"r1": 1}, base_end, [0])  # 2 new lines, 1 known
    assert out.read_text() == text
    assert jsonl_in_order(str(out), {"r1": 1}, base_end, [0, 2])
    assert out.read_text() == line(record("r0")) + line(record("r1")) + line(record("r2"))


def test_jsonl_many_rows_reversed_runs(tmp_path):
    """Runs of adjacent lines are copied in one piece; 20,000 rows, written as 4 sorted runs."""
    out = tmp_path / "out.jsonl"
    n = 20_000
    old = [i for i in range(n) if i % 4 != 1]
    out.write_text("".join(line(record(i)) for i in old))
    w = ResultWriter(str(out), append=True, positions={str(i): i for i in old})
    for i in range(n):
        w.skip(i) if i % 4 != 1 else w.add(i, record(i))
    w.close()
    assert out.read_text() == "".join(line(record(i)) for i in range(n))


# ----------------------------------------------------------------------------- Parquet


def test_parquet_resume_is_merged_in_input_order(tmp_path):
    out = str(tmp_path / "out.parquet")
    # An interrupted run: rows 0 (two samples), 2 and 4 finished; parts kept, no merge.
    with pytest.raises(KeyboardInterrupt), ResultWriter(out, row_group_size=2) as w:
        w.add(0, [record("a", sample_index=0), record("a", sample_index=1)])
        w.add(2, record("c"))
        w.add(4, record("e"))
        raise KeyboardInterrupt
    assert not os.path.exists(out) and len(os.listdir(parts_dir(out))) == 2
    os.makedirs(tmp_path / "keep")
    done = {"a": 0, "c": 2, "e": 4}
    with ResultWriter(out, row_group_size=2, append=True, positions=done) as w:
        w.skip(0), w.skip(2), w.skip(4)
        w.add(3, record("d", score=0.5))
        w.add(1, [record("b", sample_index=0), record("b", sample_index=1)])
    table = pq.read_table(out)
    assert list(zip(table.column("id").to_pylist(), table.column("sample_index").to_pylist(),
                    table.column("score").to_pylist())) == [
        ("a", 0, None), ("a", 1, None), ("b", 0, None), ("b", 1, None), ("c", None, None),
        ("d", None, 0.5), ("e", None, None)]
    f = pq.ParquetFile(out)
    sizes = [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)]
    assert sizes == [2, 2, 2, 1]  # a row's samples are never split
    assert sorted(os.listdir(tmp_path)) == ["keep", "out.parquet"]
    # A resume with nothing new keeps the complete, ordered file as it is.
    with ResultWriter(out, row_group_size=2, append=True, positions={**done, "b": 1, "d": 3}):
        pass
    assert pq.read_table(out).column("id").to_pylist() == ["a", "a", "b", "b", "c", "d", "e"]
