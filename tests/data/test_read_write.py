"""Tests for mlxpa.data: JSONL/Parquet/stdin readers, row validation, ordered writers."""

from __future__ import annotations

import io
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxpa.data import InputError, ResultWriter, Row, read_rows
from mlxpa.inputs.schema import SAMPLING_FIELDS
from mlxpa.sampling_params import SamplingParams


def write_lines(path, lines: list[str], bom: bool = False) -> str:
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
    return str(path)


def record(i: int, **extra) -> dict:
    return {"id": i, "text": f"t{i}", "finish_reason": "stop", "prompt_tokens": i,
            "completion_tokens": 2 * i, **extra}


def read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# ----------------------------------------------------------------------------- reading JSONL


def test_jsonl_rows_ids_params(tmp_path):
    src = write_lines(tmp_path / "p.jsonl", [
        json.dumps({"prompt": "Hello", "max_tokens": 8, "temperature": 0.5, "stop": "\n",
                    "extra": [1, 2]}),
        "",
        json.dumps({"id": "b", "messages": [{"role": "user", "content": "Hi"}],
                    "top_p": 1, "top_k": 4, "min_p": 0, "seed": 7, "n": 2, "stop": ["x", "y"]}),
        "   ",
        json.dumps({"id": 10, "prompt": "Bye", "max_tokens": 3.0, "temperature": None}),
    ])
    rows = list(read_rows(src))
    assert rows == [
        Row(0, 0, "Hello", None, {"max_tokens": 8, "temperature": 0.5, "stop": ["\n"]},
            None, 1),
        Row(1, "b", None, [{"role": "user", "content": "Hi"}],
            {"top_p": 1.0, "top_k": 4, "min_p": 0.0, "seed": 7, "stop": ["x", "y"], "n": 2},
            None, 3),
        Row(2, 10, "Bye", None, {"max_tokens": 3}, None, 5),
    ]
    assert isinstance(rows[2].params["max_tokens"], int)
    assert isinstance(rows[1].params["top_p"], float)


def test_jsonl_bom_and_crlf(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "caf\xc3\xa9"}\r\n\r\n{"prompt": "b"}\r\n')
    rows = list(read_rows(str(path)))
    assert [(r.index, r.prompt, r.line, r.error) for r in rows] == [
        (0, "café", 1, None), (1, "b", 3, None)]


def test_jsonl_is_lazy(tmp_path):
    src = write_lines(tmp_path / "lazy.jsonl", ['{"prompt": "a"}', '{"prompt": "b"}'])
    it = read_rows(src)
    assert next(it).prompt == "a"
    with open(src, "a") as f:  # appended after the first row was read: still seen
        f.write('{"prompt": "c"}\n')
    assert [r.prompt for r in it] == ["b", "c"]


def test_invalid_json_is_a_row_error_with_line(tmp_path):
    src = write_lines(tmp_path / "bad.jsonl", ['{"prompt": "a"}', "", '{"prompt": "b",}',
                                               '{"prompt": "c"}'])
    rows = list(read_rows(src))  # reading goes on past a bad line
    assert [(r.index, r.id, r.line) for r in rows] == [(0, 0, 1), (1, None, 3), (2, 2, 4)]
    assert rows[1].error.startswith(f"{src} line 3: invalid JSON (")
    assert (rows[1].prompt, rows[1].messages, rows[1].params) == (None, None, {})
    assert rows[0].error is None and rows[2].error is None


def test_invalid_json_says_where_the_lines_json_ends(tmp_path):
    """json's own message and column, of the line without its line end: a missing closing
    brace is at the end of the line's JSON (it was column 1 of the next line), and an
    unterminated string reads "starting at: column 12" (it read "starting at at column")."""
    import json

    lines = ['{"prompt": "hi", "max_tokens": 5', '{"prompt": "unterminated}', '{"prompt": x}']
    src = write_lines(tmp_path / "bad.jsonl", lines)
    errors = [r.error for r in read_rows(src)]
    assert errors == [f"{src} line 1: invalid JSON (Expecting ',' delimiter: column 33)",
                      f"{src} line 2: invalid JSON (Unterminated string starting at: column 12)",
                      f"{src} line 3: invalid JSON (Expecting value: column 12)"]
    for line, error in zip(lines, errors):
        with pytest.raises(json.JSONDecodeError) as e:
            json.loads(line)
        assert error.endswith(f"({e.value.msg}: column {e.value.colno})")


@pytest.mark.parametrize("line, kind", [("[1, 2]", "an array"), ('"text"', "a string"),
                                        ("3", "a number"), ("null", "null")])
def test_non_object_line_is_a_row_error(tmp_path, line, kind):
    src = write_lines(tmp_path / "arr.jsonl", ['{"prompt": "a"}', line])
    rows = list(read_rows(src))
    assert rows[1].error == f"{src} line 2: expected a JSON object, got {kind}"


def test_invalid_utf8_is_a_row_error(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n')
    rows = list(read_rows(str(path)))
    assert rows[1].error.startswith(f"{path} line 2: not valid UTF-8")
    assert rows[1].line == 2


def test_a_lone_surrogate_is_a_row_error_naming_its_field(tmp_path):
    # JSON's \ud800 escape spells a string UTF-8 cannot hold: a tokenizer, a template and the
    # output writer would each fail on it, so the row is refused as it is read.
    path = write_lines(tmp_path / "p.jsonl", [
        '{"prompt": "a"}', '{"id": "x", "prompt": "b", "stop": ["\\ud800"]}',
        '{"messages": [{"role": "user", "content": "hi \\udc00\\ud83d\\ude00"}]}',
        '{"prompt": "\\ud83d\\ude00"}', '{"prompt": "c", "\\ud800": 1}'])
    rows = list(read_rows(path))
    lone = "(JSON's \\uD800-\\uDFFF escapes must come in pairs)"
    assert rows[1].error == (f'{path} line 2: field "stop[0]" is not Unicode text: a lone '
                             f"surrogate \\ud800 at character 1 {lone}")
    assert rows[2].error == (f'{path} line 3: field "messages[0].content" is not Unicode text: '
                             f"a lone surrogate \\udc00 at character 4 {lone}")
    assert rows[4].error == (f'{path} line 5: field name "\\ud800" is not Unicode text (a '
                             "lone surrogate)")
    assert [r.id for r in rows] == [0, None, None, 3, None]
    assert rows[3].error is None and rows[3].prompt == "\U0001f600"  # a pair is one character
    for row in rows:  # every message is text an output file can hold
        (row.error or "").encode("utf-8")


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_rows(str(tmp_path / "nope.jsonl"))  # at call time, not at first next()
    (tmp_path / "p.xml").write_text("prompt\nx\n")
    with pytest.raises(InputError, match="cannot tell the format"):
        read_rows(str(tmp_path / "p.xml"))
    with pytest.raises(ValueError, match="unknown format"):
        read_rows(str(tmp_path / "p.xml"), fmt="xml")
    assert [r.prompt for r in read_rows(write_lines(tmp_path / "p.txt", ['{"prompt": "x"}']),
                                        fmt="jsonl")] == ["x"]


# ----------------------------------------------------------------------------- row errors


@pytest.mark.parametrize("obj, message", [
    ({"prompt": ""}, 'field "prompt" must be a non-empty string, got ""'),
    ({"prompt": " \n\t"}, 'field "prompt" must be a non-empty string, got " \\n\\t"'),
    ({"prompt": 5}, 'field "prompt" must be a non-empty string, got 5'),
    ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]},
     'give field "prompt" or field "messages", not both'),
    ({"text": "a"}, 'missing field "prompt" (or "messages")'),
    ({"prompt": "a", "max_tokens": "ten"}, 'field "max_tokens" must be an integer >= 0, got "ten"'),
    ({"prompt": "a", "max_tokens": -1}, 'field "max_tokens" must be an integer >= 0, got -1'),
    ({"prompt": "a", "max_tokens": 2.5}, 'field "max_tokens" must be an integer >= 0, got 2.5'),
    ({"prompt": "a", "max_tokens": True}, 'field "max_tokens" must be an integer >= 0, got true'),
    ({"prompt": "a", "temperature": -0.1},
     'field "temperature" must be a finite number >= 0, got -0.1'),
    ({"prompt": "a", "temperature": 10**400},  # beyond float's range (no OverflowError)
     'field "temperature" must be a finite number >= 0, got 1' + "0" * 56 + "..."),
    ({"prompt": "a", "top_p": 0}, 'field "top_p" must be a number in (0, 1], got 0'),
    ({"prompt": "a", "top_p": 1.5}, 'field "top_p" must be a number in (0, 1], got 1.5'),
    ({"prompt": "a", "min_p": 2}, 'field "min_p" must be a number in [0, 1], got 2'),
    ({"prompt": "a", "n": 0}, 'field "n" must be an integer from 1 to 1024, got 0'),
    ({"prompt": "a", "seed": -3}, 'field "seed" must be an integer >= 0, got -3'),
    ({"prompt": "a", "stop": 3},
     'field "stop" must be a non-empty string or a list of them, got 3'),
    ({"prompt": "a", "stop": ["x", 1]},
     'field "stop" must be a non-empty string or a list of them, got ["x", 1]'),
    ({"prompt": "a", "stop": ""}, 'field "stop" must be a non-empty string or a list of them, '
     'got ""'),
    ({"prompt": "a", "id": 1.5}, 'field "id" must be a string or an integer, got 1.5'),
    ({"messages": []},
     'field "messages" must be a non-empty list of {"role", "content"} objects, got []'),
    ({"messages": ["hi"]}, 'field "messages[0]" must be an object with "role" and "content", '
     'got "hi"'),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user"}]},
     'field "messages[1].content" must be a string, got null'),
])
def test_row_errors_name_line_and_field(tmp_path, obj, message):
    src = write_lines(tmp_path / "prompts.jsonl", ['{"prompt": "ok"}', "", json.dumps(obj)])
    rows = list(read_rows(src))  # no exception: the run can go on
    assert rows[0].error is None
    assert rows[1].index == 1 and rows[1].line == 3
    assert rows[1].error == f"{src} line 3: {message}"


def test_row_error_keeps_valid_parts_and_collects_all_problems(tmp_path):
    src = write_lines(tmp_path / "p.jsonl", [json.dumps(
        {"id": "x", "prompt": "hi", "max_tokens": "ten", "stop": 4, "temperature": 0.3})])
    (row,) = read_rows(src)
    assert (row.id, row.prompt, row.params) == ("x", "hi", {"temperature": 0.3})
    assert row.error == (f'{src} line 1: field "max_tokens" must be an integer >= 0, got "ten"; '
                         'field "stop" must be a non-empty string or a list of them, got 4')


def test_top_k_minus_one_and_message_nulls(tmp_path):
    src = write_lines(tmp_path / "p.jsonl", [json.dumps(
        {"messages": [{"role": "user", "content": "a", "name": None}], "top_k": -1})])
    (row,) = read_rows(src)
    assert (row.messages, row.params, row.error) == ([{"role": "user", "content": "a"}],
                                                     {"top_k": -1}, None)
    assert SamplingParams(**row.params).top_k == 0  # -1 is off: SamplingParams' one rule


def test_openai_batch_lines(tmp_path):
    src = write_lines(tmp_path / "batch.jsonl", [
        json.dumps({"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                             "max_completion_tokens": 5, "temperature": 0}}),
        json.dumps({"custom_id": "req-2", "body": {"prompt": "x", "max_tokens": "5"}}),
    ])
    rows = list(read_rows(src))
    assert rows[0] == Row(0, "req-1", None, [{"role": "user", "content": "Hi"}],
                          {"max_tokens": 5, "temperature": 0.0}, None, 1, openai="chat")
    assert rows[1].openai == "completions"
    assert rows[1].id == "req-2"
    assert rows[1].error == (f'{src} line 2: field "body.max_tokens" must be an integer >= 0, '
                             'got "5"')


def test_custom_columns(tmp_path):
    src = write_lines(tmp_path / "p.jsonl", [json.dumps({"key": "k1", "question": "Q?"}),
                                             json.dumps({"key": "k2"})])
    rows = list(read_rows(src, prompt_column="question", id_column="key"))
    assert [(r.id, r.prompt) for r in rows] == [("k1", "Q?"), ("k2", None)]
    assert rows[1].error == f'{src} line 2: missing field "question" (or "messages")'


# ----------------------------------------------------------------------------- stdin


def test_stdin_text_stream(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO('\ufeff{"prompt": "a"}\n\n{"prompt": "b"}\n'))
    rows = list(read_rows("-"))
    assert [(r.index, r.id, r.prompt, r.line) for r in rows] == [(0, 0, "a", 1), (1, 1, "b", 3)]


def test_stdin_reads_utf8_bytes_and_names_stdin(monkeypatch):
    data = '{"prompt": "é"}\n{"prompt": ""}\n{oops\n'.encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="latin-1"))
    it = read_rows("-")
    assert next(it).prompt == "é"  # decoded as UTF-8 whatever the text layer says
    assert next(it).error == '<stdin> line 2: field "prompt" must be a non-empty string, got ""'
    assert next(it).error.startswith("<stdin> line 3: invalid JSON")


def test_stdin_parquet(monkeypatch, tmp_path):
    pq.write_table(pa.table({"prompt": ["a", "b"]}), tmp_path / "in.parquet")
    data = (tmp_path / "in.parquet").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert [r.prompt for r in read_rows("-", fmt="parquet")] == ["a", "b"]


# ----------------------------------------------------------------------------- Parquet input


def test_parquet_rows_nulls_absent_and_0_based_rows(tmp_path):
    path = str(tmp_path / "in.parquet")
    table = pa.table({
        "id": ["a", "b", None, "d"],
        "prompt": ["P0", None, "P2", "  "],
        "messages": pa.array([None, [{"role": "user", "content": "M1"}], None, None],
                             pa.list_(pa.struct([("role", pa.string()),
                                                 ("content", pa.string())]))),
        "max_tokens": pa.array([4, None, -1, None], pa.int64()),
        "stop": pa.array([["x"], None, None, None], pa.list_(pa.string())),
        "temperature": pa.array([None, 0.7, None, None], pa.float64()),
        "unused": [1, 2, 3, 4],
    })
    pq.write_table(table, path, row_group_size=2)
    rows = list(read_rows(path))
    assert rows[0] == Row(0, "a", "P0", None, {"max_tokens": 4, "stop": ["x"]}, None, 0)
    assert rows[1] == Row(1, "b", None, [{"role": "user", "content": "M1"}],
                          {"temperature": 0.7}, None, 1)
    assert (rows[2].id, rows[2].line, rows[2].error) == (
        2, 2, f'{path} row 2: field "max_tokens" must be an integer >= 0, got -1')
    assert rows[3].error == f'{path} row 3: field "prompt" must be a non-empty string, got "  "'


def test_parquet_file_level_errors(tmp_path):
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "noprompt.parquet")
    with pytest.raises(InputError, match=r'no column "prompt" or "messages" \(columns: text\)'):
        list(read_rows(str(tmp_path / "noprompt.parquet")))
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match="not a readable Parquet file") as info:
        list(read_rows(str(tmp_path / "junk.parquet")))
    assert info.value.line is None


def test_parquet_round_trip_through_reader_and_writer(tmp_path):
    src = str(tmp_path / "in.parquet")
    pq.write_table(pa.table({"id": [5, 6, 7], "prompt": ["a", "b", "c"]}), src)
    out = str(tmp_path / "out.parquet")
    with ResultWriter(out) as w:
        for row in reversed(list(read_rows(src))):
            w.add(row.index, record(row.id, text=row.prompt.upper()))
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == [5, 6, 7]
    assert table.column("text").to_pylist() == ["A", "B", "C"]
    assert table.schema.field("id").type == pa.int64()


# ----------------------------------------------------------------------------- JSONL writer


def test_jsonl_writer_orders_and_flushes_as_rows_become_contiguous(tmp_path):
    out = tmp_path / "out.jsonl"
    with ResultWriter(str(out)) as w:
        w.add(2, record(2))
        assert not out.exists() and w.num_written == 0  # created with its first line
        w.add(0, record(0, text="é\n"))
        # row 0 is on disk before row 1 arrives; row 2 still waits for 1
        assert read_jsonl(out) == [record(0, text="é\n")]
        assert '"é\\n"' in out.read_text(encoding="utf-8")  # ensure_ascii=False
        assert w.num_written == 1
        w.add(1, record(1))
        assert read_jsonl(out) == [record(0, text="é\n"), record(1), record(2)]
        assert w.num_written == 3
    assert [r["id"] for r in read_jsonl(out)] == [0, 1, 2]


def test_jsonl_round_trip_reader_writer(tmp_path):
    src = write_lines(tmp_path / "in.jsonl", [json.dumps({"id": f"r{i}", "prompt": f"p{i}"})
                                              for i in range(5)])
    out = str(tmp_path / "out.jsonl")
    rows = list(read_rows(src))
    with ResultWriter(out) as w:
        for row in sorted(rows, key=lambda r: -r.index):
            w.add(row.index, {"id": row.id, "text": row.prompt, "finish_reason": "length",
                              "prompt_tokens": 1, "completion_tokens": 0})
    assert [(r["id"], r["text"]) for r in read_jsonl(out)] == [(f"r{i}", f"p{i}")
                                                                for i in range(5)]


def test_writer_to_stdout(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buf)
    with ResultWriter("-") as w:
        w.add(1, record(1))
        assert buf.getvalue() == ""
        w.add(0, record(0))
    assert [json.loads(line) for line in buf.getvalue().splitlines()] == [record(0), record(1)]
    assert not buf.closed


def test_writer_several_records_per_index_and_unordered(tmp_path):
    out = str(tmp_path / "o.jsonl")
    with ResultWriter(out) as w:
        w.add(1, [record(1, sample=0), record(1, sample=1)])
        w.add(0, record(0))
    assert [(r["id"], r.get("sample")) for r in read_jsonl(out)] == [(0, None), (1, 0), (1, 1)]
    with ResultWriter(out, ordered=False) as w:
        w.add(2, record(2))
        w.add(0, record(0))
    assert [r["id"] for r in read_jsonl(out)] == [2, 0]


def test_writer_rejects_duplicates_and_add_after_close(tmp_path):
    w = ResultWriter(str(tmp_path / "o.jsonl"))
    w.add(0, record(0))
    with pytest.raises(ValueError, match="already added"):
        w.add(0, record(0))
    w.add(2, record(2))
    with pytest.raises(ValueError, match="already added"):
        w.add(2, record(2))
    w.close()
    w.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        w.add(1, record(1))


def test_close_writes_rows_after_a_gap(tmp_path):
    out = str(tmp_path / "o.jsonl")
    with pytest.raises(KeyboardInterrupt), ResultWriter(out) as w:
        w.add(0, record(0))
        w.add(3, record(3))
        w.add(2, record(2))
        raise KeyboardInterrupt  # row 1 never finished
    assert [r["id"] for r in read_jsonl(out)] == [0, 2, 3]


# ----------------------------------------------------------------------------- Parquet writer


def test_parquet_writer_temp_file_then_rename(tmp_path):
    out = tmp_path / "out.parquet"
    out.write_bytes(b"old contents")
    w = ResultWriter(str(out), row_group_size=2)
    for i in (3, 1, 0, 4, 2):
        w.add(i, record(i, error=None if i != 4 else "boom"))
    assert out.read_bytes() == b"old contents"  # the target is untouched until close
    temps = [p for p in os.listdir(tmp_path) if p != "out.parquet"]
    assert len(temps) == 1 and temps[0].startswith(".out.parquet.")
    w.close()
    assert os.listdir(tmp_path) == ["out.parquet"]
    f = pq.ParquetFile(out)
    assert f.metadata.num_rows == 5 and f.num_row_groups == 3
    table = f.read()
    assert table.schema.names == ["id", "text", "finish_reason", "prompt_tokens",
                                  "completion_tokens", "cached_tokens", "error"]
    assert [table.schema.field(n).type for n in table.schema.names] == [
        pa.int64(), pa.string(), pa.string(), pa.int64(), pa.int64(), pa.int64(), pa.string()]
    assert table.to_pylist() == [{**record(i), "cached_tokens": None,
                                  "error": "boom" if i == 4 else None} for i in range(5)]
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(out).st_mode & 0o777 == 0o666 & ~mask


def test_parquet_writer_mixed_ids_and_new_columns_widen(tmp_path):
    out = str(tmp_path / "out.parquet")
    with ResultWriter(out, row_group_size=2) as w:
        w.add(0, record(0))
        w.add(1, record(1, score=1))
        w.add(2, record(2, id="two", score=2.5))  # string id and a float after ints
        w.add(3, record(3, tags=["a"]))
    table = pq.read_table(out)
    assert table.schema.field("id").type == pa.string()
    assert table.column("id").to_pylist() == ["0", "1", "two", "3"]
    assert table.schema.field("score").type == pa.float64()
    assert table.column("score").to_pylist() == [None, 1.0, 2.5, None]
    assert table.column("tags").to_pylist() == [None, None, None, ["a"]]
    assert table.schema.field("prompt_tokens").type == pa.int64()
    assert table.column("prompt_tokens").to_pylist() == [0, 1, 2, 3]
    assert sorted(os.listdir(tmp_path)) == ["out.parquet"]


def test_parquet_writer_empty_and_stdout_refused(tmp_path):
    out = str(tmp_path / "empty.parquet")
    ResultWriter(out).close()
    table = pq.read_table(out)
    assert table.num_rows == 0 and table.schema.field("id").type == pa.int64()
    with pytest.raises(ValueError, match="stdout"):
        ResultWriter("-", fmt="parquet")


# ----------------------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(st.permutations(range(12)), st.sampled_from(["jsonl", "parquet"]))
def test_any_permutation_of_adds_gives_input_order(tmp_path_factory, order, fmt):
    out = str(tmp_path_factory.mktemp("perm") / f"out.{fmt}")
    with ResultWriter(out, row_group_size=5) as w:
        written = []
        for i in order:
            w.add(i, record(i))
            written.append(w.num_written)
    # num_written is exactly the length of the done prefix after each add
    done: set[int] = set()
    expected = []
    for i in order:
        done.add(i)
        k = 0
        while k in done:
            k += 1
        expected.append(k)
    assert written == expected
    ids = read_jsonl(out) if fmt == "jsonl" else pq.read_table(out).to_pylist()
    assert [r["id"] for r in ids] == list(range(12))


def test_sampling_fields_constant():
    assert SAMPLING_FIELDS == ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
                               "stop", "n", "stop_token_ids", "ignore_eos",
                               "include_stop_str_in_output", "min_tokens", "repetition_penalty",
                               "presence_penalty", "frequency_penalty", "logit_bias",
                               "prompt_logprobs")


def test_text_file_is_one_prompt_per_line(tmp_path):
    """``examples/reviews.txt``-style input: each non-blank line a prompt, line numbers kept,
    a BOM and CRLF endings removed, blank lines skipped."""
    path = tmp_path / "reviews.txt"
    path.write_bytes("\ufeffGreat value.\r\n\r\n  Broke after a week. \n".encode())
    rows = list(read_rows(str(path)))
    assert [(r.prompt, r.line, r.index) for r in rows] == [
        ("Great value.", 1, 0), ("  Broke after a week. ", 3, 1)]
    assert all(r.error is None for r in rows)
