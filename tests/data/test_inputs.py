"""Input formats and row checks added for batch users: CSV, Hugging Face ``datasets`` folders
and files, OpenAI Batch lines, --system, --keep-columns, unknown sampling fields, the stop and
decode fields, Parquet nulls."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mlxpa.data import InputError, Row, read_rows


def write_jsonl(path, objs) -> str:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return str(path)


def one(tmp_path, obj, **kw) -> Row:
    (row,) = read_rows(write_jsonl(tmp_path / "p.jsonl", [obj]), **kw)
    return row


# ----------------------------------------------------------------------------- CSV


def test_csv_types_lines_and_quoting(tmp_path):
    path = tmp_path / "p.csv"
    path.write_bytes(
        b'\xef\xbb\xbfid,prompt,max_tokens,temperature,stop,ignore_eos,stop_token_ids,cat\n'
        b'a,"hello, ""world""",5,0.5,END,true,"[1, 2]",x\n'
        b'b,"two\nlines",,,,,,\n'
        b'\n'
        b'c,x,ten,,"[""a"", ""b""]",maybe,,\n'
        b'd,short\n')
    rows = list(read_rows(str(path), keep_columns=("cat",)))
    assert rows[0] == Row(0, "a", 'hello, "world"', None,
                          {"max_tokens": 5, "temperature": 0.5, "stop": ["END"],
                           "stop_token_ids": [1, 2], "ignore_eos": True}, None, 2,
                          {"cat": "x"})
    assert (rows[1].id, rows[1].prompt, rows[1].params, rows[1].line) == (
        "b", "two\nlines", {}, 3)  # empty cells are absent; a quoted newline stays in line 3
    assert rows[2].line == 6 and rows[2].params == {"stop": ["a", "b"]}
    assert rows[2].error == (f'{path} line 6: field "max_tokens" must be an integer >= 0, '
                             'got "ten"; field "ignore_eos" must be true or false, got "maybe"')
    assert rows[3].error == f"{path} line 7: expected 8 fields as in the header, got 2"


def test_csv_without_prompt_column_and_tsv(tmp_path):
    (tmp_path / "q.csv").write_text("question\nx\n")
    with pytest.raises(InputError, match='no column "prompt" or "messages"'):
        list(read_rows(str(tmp_path / "q.csv")))
    assert [r.prompt for r in read_rows(str(tmp_path / "q.csv"), prompt_column="question")] == [
        "x"]
    (tmp_path / "t.tsv").write_text('prompt\tmessages\na,b\t\n\t[{"role": "user", '
                                    '"content": "hi"}]\n')
    rows = list(read_rows(str(tmp_path / "t.tsv")))
    assert rows[0].prompt == "a,b"
    assert rows[1].messages == [{"role": "user", "content": "hi"}]


# ----------------------------------------------------------------------------- datasets


def test_datasets_folder_and_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"id": ["a", "b"], "prompt": ["x", None],
                                     "max_tokens": [3, None], "cat": [1, 2],
                                     "big": ["unused", "column"]})
    ds.save_to_disk(str(tmp_path / "ds"))
    rows = list(read_rows(str(tmp_path / "ds"), keep_columns=("cat",)))
    assert rows[0] == Row(0, "a", "x", None, {"max_tokens": 3}, None, 0, {"cat": 1})
    assert rows[1].error == (f'{tmp_path / "ds"} row 1: field "prompt" is null '
                             '(and no "messages")')
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(InputError, match=r"has splits train, test; give one split's folder"):
        list(read_rows(str(tmp_path / "dd")))
    assert [r.id for r in read_rows(str(tmp_path / "dd" / "test"))] == ["a", "b"]


def test_datasets_local_files(tmp_path):
    pytest.importorskip("datasets")
    (tmp_path / "arr.json").write_text(json.dumps([{"id": 1, "prompt": "p1"},
                                                   {"id": 2, "prompt": "p2"}]))
    rows = list(read_rows(str(tmp_path / "arr.json"), fmt="hf"))  # a JSON array, not lines
    assert [(r.id, r.prompt, r.line) for r in rows] == [(1, "p1", 0), (2, "p2", 1)]
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "train.jsonl").write_text('{"prompt": "f1"}\n{"prompt": "f2"}\n')
    assert [r.prompt for r in read_rows(str(tmp_path / "files"))] == ["f1", "f2"]


def test_hub_name_is_a_clear_offline_error():
    with pytest.raises(InputError, match="hub dataset cannot be downloaded here") as info:
        read_rows("someone/some-dataset")  # no extension, not a path: a hub id
    assert "save_to_disk" in str(info.value)


# ----------------------------------------------------------------------------- OpenAI Batch


def test_openai_batch_lines_checked(tmp_path):
    line = {"custom_id": "q", "method": "POST", "url": "/v1/completions",
            "body": {"model": "m", "prompt": "x", "max_tokens": 2, "stream": False,
                     "user": "u"}}
    row = one(tmp_path, line)
    assert (row.id, row.prompt, row.params, row.openai, row.error) == (
        "q", "x", {"max_tokens": 2}, "completions", None)
    bad = {"custom_id": "", "method": "GET", "url": "/v1/embeddings",
           "body": {"prompt": "x", "frequency_penalty": 3, "max_tokns": 3, "stream": True}}
    assert one(tmp_path, bad).error == (
        f'{tmp_path / "p.jsonl"} line 1: field "custom_id" must be a non-empty string, got ""; '
        'field "method" must be "POST", got "GET"; field "url" must be '
        '"/v1/chat/completions" or "/v1/completions", got "/v1/embeddings"; '
        'field "body.max_tokns": unknown sampling field (did you mean "max_tokens"?); '
        'field "body.stream" must be false (a batch does not stream), got true; '
        'field "body.frequency_penalty" must be a number from -2 to 2 (0: off), got 3')
    chat_url = {**line, "url": "/v1/chat/completions"}
    assert one(tmp_path, chat_url).error.endswith(
        'field "url" "/v1/chat/completions" needs field "body.messages"')
    assert one(tmp_path, {"custom_id": "z", "body": "text"}).error.endswith(
        'field "body" must be an object, got "text"; missing field "body.prompt" '
        '(or "body.messages")')


# ----------------------------------------------------------------------------- fields


def test_unknown_sampling_fields_and_passthrough(tmp_path):
    row = one(tmp_path, {"prompt": "x", "temprature": 0.5, "echo": True, "category": "c",
                         "url": "http://example.com", "top_k": None})
    assert row.error == (f'{tmp_path / "p.jsonl"} line 1: field "temprature": unknown sampling '
                         'field (did you mean "temperature"?); field "echo" is not supported '
                         "by mlxpa: echoing the prompt is not implemented (prompt_logprobs "
                         "gives its log-probabilities)")
    assert one(tmp_path, {"prompt": "x", "category": "c", "max_completion_tokens": 4}).params == {
        "max_tokens": 4}


def test_stop_and_decode_fields(tmp_path):
    row = one(tmp_path, {"prompt": "x", "stop_token_ids": 7, "ignore_eos": True,
                         "include_stop_str_in_output": False, "min_tokens": 3.0})
    assert row.params == {"stop_token_ids": [7], "ignore_eos": True,
                          "include_stop_str_in_output": False, "min_tokens": 3}
    row = one(tmp_path, {"prompt": "x", "stop_token_ids": [1, -2], "ignore_eos": 1,
                         "include_stop_str_in_output": "yes", "min_tokens": -1})
    assert row.params == {}
    assert row.error == (
        f'{tmp_path / "p.jsonl"} line 1: field "stop_token_ids" must be a token id (an integer '
        '>= 0) or a list of them, got [1, -2]; field "ignore_eos" must be true or false, got 1; '
        'field "include_stop_str_in_output" must be true or false, got "yes"; '
        'field "min_tokens" must be an integer >= 0, got -1')


def test_system_message_and_keep_columns(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "Q1", "cat": "a", "score": 1.5},
        {"messages": [{"role": "user", "content": "Q2"}]},
        {"messages": [{"role": "system", "content": "own"}, {"role": "user", "content": "Q3"}],
         "cat": None},
    ])
    rows = list(read_rows(src, system="Be brief.", keep_columns=("cat", "score")))
    assert rows[0].prompt == "Be brief.\n\nQ1"
    assert rows[1].messages == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Q2"}]
    assert rows[2].messages[0] == {"role": "system", "content": "own"}  # kept as it is
    assert [r.keep for r in rows] == [{"cat": "a", "score": 1.5}, {"cat": None, "score": None},
                                      {"cat": None, "score": None}]


def test_parquet_nulls_named(tmp_path):
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"id": pa.array([None, "b"], pa.string()),
                             "prompt": pa.array([None, "x"], pa.string()),
                             "seed": pa.array([None, None], pa.int64()),
                             "presence_penalty": pa.array([None, 2.5], pa.float64())}), path)
    rows = list(read_rows(str(path)))
    assert rows[0].id == 0  # a null id takes the row index
    assert rows[0].error == f'{path} row 0: field "prompt" is null (and no "messages")'
    assert rows[1].error == (f'{path} row 1: field "presence_penalty" must be a number from '
                             "-2 to 2 (0: off), got 2.5")


def test_openai_text_content_parts_and_switched_off_features(tmp_path):
    from mlxpa.data import read_rows

    src = tmp_path / "batch.jsonl"
    lines = [
        {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": [
             {"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}],
             "logprobs": False, "presence_penalty": 0}},
        {"custom_id": "r2", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": [
             {"type": "image_url", "image_url": {"url": "x"}}]}]}},
        {"custom_id": "r3", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "Hi"}], "logit_bias": {"1": 2},
                  "bad_words": ["x"]}},
    ]
    src.write_text("".join(json.dumps(o) + "\n" for o in lines))
    r1, r2, r3 = read_rows(str(src))
    assert r1.error is None and r1.messages == [{"role": "user", "content": "Hi\nthere"}]
    assert 'body.messages[0].content" must be a string or a list of {"type": "text"' in r2.error
    assert r3.params == {"logit_bias": {1: 2}}
    assert r3.error.endswith('field "body.bad_words" is not supported by mlxpa: banning words '
                             'is not implemented (logit_bias -100 bans single tokens)')


def test_openai_line_without_custom_id_names_it_and_has_no_id(tmp_path):
    from mlxpa.data import read_rows

    src = tmp_path / "batch.jsonl"
    src.write_text(json.dumps({"method": "POST", "url": "/v1/chat/completions",
                               "body": {"messages": [{"role": "user", "content": "Hi"}]}})
                   + "\n")
    (row,) = read_rows(str(src))
    assert row.id is None and row.openai == "chat"
    assert 'field "custom_id" must be a non-empty string' in row.error
    assert "prompt" not in row.error
