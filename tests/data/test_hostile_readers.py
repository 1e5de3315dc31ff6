"""Issue 12 items 3-4: no format refuses a row another accepts (cell, line and string sizes;
deep nesting and huge integers), and OpenAI Batch bodies read as OpenAI and vLLM read them.

Oracles: the text written into the file (read back unchanged, in every format), Python's
``tracemalloc`` peak against the size of one row, and the OpenAI / vLLM field rules quoted in
the issue (``max_completion_tokens or max_tokens``)."""

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


# ----------------------------------------------------------------------------- OpenAI Batch

def _body(**body) -> dict:
    return {"custom_id": "q", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **body}}


def _one(tmp_path, obj):
    src = tmp_path / "b.jsonl"
    src.write_text(json.dumps(obj) + "\n")
    (row,) = read_rows(str(src))
    return row


def test_max_completion_tokens_wins_over_max_tokens(tmp_path):
    assert _one(tmp_path, _body(max_tokens=50, max_completion_tokens=7)).params == {
        "max_tokens": 7}
    assert _one(tmp_path, _body(max_tokens=50)).params == {"max_tokens": 50}
    row = _one(tmp_path, _body(max_tokens=5, max_completion_tokens=-1))
    assert 'field "body.max_completion_tokens" must be an integer >= 0, got -1' in row.error
    plain = _one(tmp_path, {"prompt": "x", "max_tokens": 9, "max_completion_tokens": 3})
    assert plain.params == {"max_tokens": 3}


def test_restated_defaults_are_accepted_and_ignored(tmp_path):
    row = _one(tmp_path, _body(response_format={"type": "text"}, n=1, stream=False,
                               logprobs=False, parallel_tool_calls=True, user="u-1",
                               metadata={"team": "x"}, store=False, presence_penalty=0.0,
                               frequency_penalty=0, top_logprobs=0, tool_choice="none",
                               service_tier="auto", stream_options=None))
    assert row.error is None
    # the structured-output and penalty fields restated at their defaults ask for nothing
    assert row.params == {"n": 1, "structured": None, "logprobs": False, "top_logprobs": 0,
                          "presence_penalty": 0.0, "frequency_penalty": 0.0}


@pytest.mark.parametrize("field,value,why", [
    ("tools", [{"type": "function", "function": {"name": "f"}}], "tool calling"),
    ("tool_choice", "auto", "tool calling"), ("best_of", 2, "ranking best_of"),
    ("echo", True, "echoing the prompt"), ("use_beam_search", True, "beam search"),
    ("n", 0, "must be an integer from 1"), ("stream", True, "does not stream"),
])
def test_features_that_change_the_output_are_errors_naming_them(tmp_path, field, value, why):
    row = _one(tmp_path, _body(**{field: value}))
    assert f'line 1: field "body.{field}"' in row.error
    assert why in row.error  # the reason, not only "not supported"


@pytest.mark.parametrize("field,value,params", [
    ("prompt_logprobs", 2, {"prompt_logprobs": 2}),
    ("presence_penalty", 0.5, {"presence_penalty": 0.5}),
    ("frequency_penalty", -2, {"frequency_penalty": -2.0}),
    ("repetition_penalty", 1.3, {"repetition_penalty": 1.3}),
    ("logit_bias", {"5": 1, "7": -100.0}, {"logit_bias": {5: 1, 7: -100.0}}),
])
def test_penalty_fields_are_read(tmp_path, field, value, params):
    row = _one(tmp_path, _body(**{field: value}))
    assert row.error is None and row.params == params


def test_plain_rows_use_the_same_table(tmp_path):
    ok = _one(tmp_path, {"prompt": "x", "logprobs": False, "response_format": {"type": "text"},
                         "user": "u", "presence_penalty": 0.5})
    assert ok.error is None and ok.params["presence_penalty"] == 0.5
    bad = _one(tmp_path, {"prompt": "x", "use_beam_search": True})
    assert bad.error.endswith('field "use_beam_search" is not supported by mlxpa: beam search '
                              'is not implemented')


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


def test_n_is_bounded(tmp_path):
    """n = 10**9 would queue a billion requests: an error naming the bound (1024)."""
    assert _one(tmp_path, {"prompt": "x", "n": 1024}).params == {"n": 1024}
    row = _one(tmp_path, {"prompt": "x", "n": 10**9})
    assert row.error.endswith('field "n" must be an integer from 1 to 1024, got 1000000000')


def test_jsonl_output_is_strict_json():
    from mlxpa.data.jsonl import json_line

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
