"""Durability pieces without a model: Parquet parts and merge, reading an existing output for
--resume (torn lines, partial samples), the validation pass, OpenAI output records."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mlxpa.data import InputError, ResultWriter, Row, read_rows
from mlxpa.data.parquet import parts_dir
from mlxpa.data.records import error_records, resolve_output_format, result_records
from mlxpa.data.resume import COMPLETE, Tail, read_existing, resume_hint
from mlxpa.data.validate import MAX_PROBLEMS, check, validate
from mlxpa.request import SampleOutput


def record(i, **extra) -> dict:
    return {"id": i, "text": f"t{i}", "finish_reason": "stop", "prompt_tokens": 1,
            "completion_tokens": 1, "cached_tokens": 0, **extra}


# ----------------------------------------------------------------------------- Parquet


def test_parquet_finished_groups_survive_a_crash_and_resume_merges(tmp_path):
    out = str(tmp_path / "out.parquet")
    w = ResultWriter(out, row_group_size=2)
    for i in range(5):
        w.add(i, record(i))
    # a crash now (no close): two complete part files, no target
    parts = sorted(os.listdir(parts_dir(out)))
    assert parts == ["part-000000.parquet", "part-000001.parquet"]
    assert not os.path.exists(out)
    assert pq.read_table(os.path.join(parts_dir(out), parts[1])).column("id").to_pylist() == [
        2, 3]
    with open(os.path.join(parts_dir(out), "part-000002.parquet.tmp"), "wb") as f:
        f.write(b"PAR1 torn")  # a part torn by the crash: ignored
    existing = read_existing(out, "parquet")
    assert existing.counts == {"0": 1, "1": 1, "2": 1, "3": 1} and existing.fmt == "mlxpa"
    with ResultWriter(out, row_group_size=2, append=True) as w2:
        for i in range(4):
            w2.skip(i)
        w2.add(4, record(4, extra="new column"))
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == [0, 1, 2, 3, 4]
    assert table.column("extra").to_pylist() == [None] * 4 + ["new column"]
    assert sorted(os.listdir(tmp_path)) == ["out.parquet"]
    # resume again on the complete file: it is kept and extended
    assert read_existing(out, "parquet").counts == {str(i): 1 for i in range(5)}
    with ResultWriter(out, append=True) as w3:
        w3.add(0, record("s", sample_index=0))
    assert pq.read_table(out).column("id").to_pylist() == ["0", "1", "2", "3", "4", "s"]


def test_parquet_row_group_never_splits_a_rows_samples(tmp_path):
    out = str(tmp_path / "o.parquet")
    with ResultWriter(out, row_group_size=2) as w:
        w.add(0, [record(0, sample_index=s) for s in range(3)])
        w.add(1, record(1))
        w.add(2, record(2))
    f = pq.ParquetFile(out)
    assert [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)] == [3, 2]


def test_parquet_ctrl_c_keeps_parts_without_merging(tmp_path):
    out = str(tmp_path / "o.parquet")
    with pytest.raises(KeyboardInterrupt), ResultWriter(out, row_group_size=10) as w:
        w.add(0, record(0))
        raise KeyboardInterrupt
    assert not os.path.exists(out)
    assert read_existing(out, "parquet").counts == {"0": 1}
    with ResultWriter(out) as w:  # no --resume: the stale parts are dropped
        w.add(0, record(9))
    assert pq.read_table(out).column("id").to_pylist() == [9]


# ----------------------------------------------------------------------------- JSONL


def test_jsonl_existing_torn_line_is_cut(tmp_path):
    out = tmp_path / "o.jsonl"
    good = "".join(json.dumps(record(i)) + "\n" for i in range(3))
    out.write_text(good + '{"id": 3, "text": "half')
    e = read_existing(str(out), "jsonl")
    assert e.torn and e.counts == {"0": 1, "1": 1, "2": 1} and e.fmt == "mlxpa"
    assert out.read_text() == good
    with ResultWriter(str(out), append=True) as w:
        w.add(0, record(3))
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [0, 1, 2, 3]
    out.write_text(good + "not json\n" + good)
    with pytest.raises(ValueError, match="line 4: not an mlxpa result line"):
        read_existing(str(out), "jsonl")
    assert read_existing(str(tmp_path / "none.jsonl"), "jsonl").counts == {}


def test_partial_samples_of_the_last_row_are_cut_and_rerun(tmp_path):
    out = tmp_path / "o.jsonl"
    lines = [record("a", sample_index=0), record("a", sample_index=1),
             {**record("e"), "text": None, "error": "bad"}, record("b", sample_index=0)]
    out.write_text("".join(json.dumps(r) + "\n" for r in lines))
    e = read_existing(str(out), "jsonl")
    # The error record is removed from the file: row "e" runs again.
    assert e.counts == {"a": 2, "b": 1} and e.retried == 1
    kept = [lines[0], lines[1], lines[3]]
    assert out.read_text() == "".join(json.dumps(r) + "\n" for r in kept)
    offset = len("".join(json.dumps(r) + "\n" for r in kept[:2]).encode())
    assert e.tail == Tail("b", offset, 1)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "prompt": "x"}) + "\n" for i in "aebc"))
    v = validate(read_rows(str(src)), source=str(src), unit="line", existing=e, default_n=2)
    assert v.done == {"a": 0} and v.num_done == 1 and v.cut_at == offset


def test_openai_lines_count_whole_rows_and_errors_are_dropped(tmp_path):
    out = tmp_path / "o.jsonl"
    ok = {"id": "batch_req_1", "custom_id": "r1", "response": {"status_code": 200},
          "error": None}
    bad = {"id": "batch_req_2", "custom_id": "r2", "response": None,
           "error": {"code": "invalid_request", "message": "x"}}
    out.write_text(json.dumps(ok) + "\n" + json.dumps(bad) + "\n")
    e = read_existing(str(out), "jsonl")
    assert e.counts == {"r1": COMPLETE} and e.fmt == "openai" and e.retried == 1
    assert out.read_text() == json.dumps(ok) + "\n"


# ----------------------------------------------------------------------------- validation


def test_validation_lists_first_problems_and_duplicates(tmp_path):
    src = tmp_path / "in.jsonl"
    objs = [{"id": "x", "prompt": "ok"}] + [{"id": "x", "prompt": "dup"}] + [
        {"prompt": ""} for _ in range(MAX_PROBLEMS + 5)]
    src.write_text("".join(json.dumps(o) + "\n" for o in objs) + "{bad\n")
    v = validate(read_rows(str(src)), source=str(src), unit="line")
    assert (v.num_rows, v.num_problems, len(v.problems)) == (len(objs) + 1, len(objs), 20)
    assert v.problems[0] == f'{src} line 2: duplicate id "x" (first at line 1)'
    assert v.row_problems == {1: v.problems[0]}
    assert v.problems[1] == f'{src} line 3: field "prompt" must be a non-empty string, got ""'
    with pytest.raises(InputError) as info:
        check(v, str(src))
    message = str(info.value)
    assert message.startswith(f"{src}: {len(objs)} invalid row(s) of {len(objs) + 1}; nothing")
    assert message.endswith(f"\n  ... and {len(objs) - 20} more")
    assert not v.all_openai


def test_int_and_string_ids_are_the_same_id(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 7, "prompt": "a"}\n{"id": "7", "prompt": "b"}\n')
    v = validate(read_rows(str(src)), source="in", unit="line")
    assert v.problems == ['in line 2: duplicate id "7" (first at line 1)']


# ----------------------------------------------------------------------------- records


def _out(i, text, tokens, reason="stop"):
    return SampleOutput(request_id=0, text=text, token_ids=list(range(tokens)),
                         finish_reason=reason, num_prompt_tokens=4, sample_index=i,
                         num_cached_tokens=2)


def test_openai_output_lines():
    chat = Row(3, "c1", None, [{"role": "user", "content": "hi"}], {}, line=4,
               keep={"tag": "t"}, openai="chat")
    (line,) = result_records(chat, [_out(0, "A", 2), _out(1, "B", 3, "length")], "openai",
                             "tiny", "f line 4")
    body = line["response"].pop("body")
    assert line == {"id": "batch_req_3", "custom_id": "c1",
                    "response": {"status_code": 200, "request_id": "req_3"}, "error": None,
                    "tag": "t"}
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    assert body["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": "A"}, "logprobs": None,
         "finish_reason": "stop"},
        {"index": 1, "message": {"role": "assistant", "content": "B"}, "logprobs": None,
         "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9,
                             "prompt_tokens_details": {"cached_tokens": 2}}
    text = Row(0, "t1", "p", None, {}, openai="completions")
    (line,) = result_records(text, [_out(0, "Z", 1)], "openai", "m", "f line 1")
    assert line["response"]["body"]["object"] == "text_completion"
    assert line["response"]["body"]["choices"][0]["text"] == "Z"
    assert error_records(text, "f line 1: boom", "openai") == [
        {"id": "batch_req_0", "custom_id": "t1", "response": None,
         "error": {"code": "invalid_request", "message": "f line 1: boom"}}]


def test_resolve_output_format():
    assert resolve_output_format("auto", "jsonl", None, True) == "openai"
    assert resolve_output_format("auto", "parquet", None, True) == "mlxpa"
    assert resolve_output_format("auto", "jsonl", None, False) == "mlxpa"
    assert resolve_output_format("auto", "jsonl", "mlxpa", True) == "mlxpa"
    with pytest.raises(ValueError, match="writes JSONL"):
        resolve_output_format("openai", "parquet", None, True)
    with pytest.raises(ValueError, match="holds mlxpa records"):
        resolve_output_format("openai", "jsonl", "mlxpa", True)


def test_parquet_merge_widens_part_schemas(tmp_path):
    out = str(tmp_path / "w.parquet")
    with ResultWriter(out, row_group_size=1) as w:
        w.add(0, record(0, score=1))
        w.add(1, record("b", score=2.5))
    t = pq.read_table(out)
    assert t.schema.field("id").type == pa.string()
    assert t.column("id").to_pylist() == ["0", "b"]
    assert t.column("score").to_pylist() == [1.0, 2.5]


def test_a_duplicate_id_is_never_done_on_resume(tmp_path):
    out = tmp_path / "o.jsonl"
    out.write_text(json.dumps(record(1)) + "\n")
    src = tmp_path / "in.jsonl"
    # Row 1 has no id: it defaults to its index, 1, which row 0 already has.
    src.write_text('{"id": 1, "prompt": "a"}\n{"prompt": "b"}\n')
    v = validate(read_rows(str(src)), source=str(src), unit="line",
                 existing=read_existing(str(out), "jsonl"))
    assert v.done == {"1": 0} and v.num_done == 1
    assert v.row_problems == {1: f"{src} line 2: duplicate id 1 (a row without an id field "
                                 "has its index as id) (first at line 1)"}


def test_sampling_fields_are_checked_against_the_defaults(tmp_path):
    from mlxpa.sampling_params import SamplingParams

    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "a", "min_tokens": 5, "max_tokens": 2}\n'
                   '{"prompt": "b", "min_tokens": 5}\n{"prompt": "c", "min_tokens": 2}\n')
    v = validate(read_rows(str(src)), source=str(src), unit="line",
                 defaults=SamplingParams(max_tokens=3))
    assert sorted(v.row_problems) == [0, 1] and v.num_problems == 2
    assert v.problems[0].startswith(f"{src} line 1: ") and "min_tokens" in v.problems[0]


def test_resume_hint_when_nothing_was_written(tmp_path):
    out = str(tmp_path / "never.jsonl")
    hint = resume_hint("in.jsonl", out, ["mlxpa", "run", "in.jsonl", "-o", out])
    assert hint == f"interrupted before any row finished; nothing was written to {out}"
