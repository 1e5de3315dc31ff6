"""Hypothesis strategies for hostile input files and engine options, and the run invariants
(issue 12 "Fuzzing"); used by ``tests/test_fuzz.py`` and ``scripts/fuzz.py``.

A case is rows (valid ones, rows of random field names and JSON values, undecodable lines),
a format (JSONL, CSV, Parquet, OpenAI Batch), engine options (tiny pools, block sizes, chunk
budgets, context) and the run's sampling defaults. :func:`check_case` runs it through
:func:`mlxpa.batch.run.run_file` (what ``mlxpa run`` calls) on a tiny random model and checks:

* nothing but ``InputError`` (exit status 2) escapes, and only when rows are invalid and
  ``--skip-invalid`` is off; every problem it lists names the file and the row's line;
* one output record per input row and sample (per row for OpenAI lines), in input order;
* an error record names the row's file and line (and a field, unless the record could not
  be decoded at all);
* every row that ran gives the same text, finish reason and token counts as when it runs
  alone, at the same line, its neighbours replaced by undecodable lines.
"""

from __future__ import annotations

import csv
import io
import json
import re
import warnings
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import strategies as st

from mlxpa.batch.run import RunOptions, run_file
from mlxpa.config import EngineConfig
from mlxpa.data import InputError, InputOptions
from mlxpa.engine import LLMEngine
from mlxpa.sampling_params import SamplingParams

CONTROL = ["<eos>", "<bos>", "<pad>", "<start_of_turn>", "<end_of_turn>\n<start_of_turn>model",
           "<|im_start|>", "<|endoftext|>"]
KNOWN = ["prompt", "messages", "id", "max_tokens", "max_completion_tokens", "temperature",
         "top_p", "top_k", "min_p", "seed", "stop", "n", "stop_token_ids", "ignore_eos",
         "include_stop_str_in_output", "min_tokens", "logprobs", "response_format", "stream",
         "user", "presence_penalty", "temprature", "custom_id", "body", "url", "method",
         "cache_salt"]
RECORD_PROBLEMS = ("invalid JSON", "unreadable JSON", "not valid UTF-8", "expected a JSON",
                   "expected ", "duplicate id")

text = st.one_of(st.text(max_size=12), st.sampled_from(CONTROL),
                 st.builds(lambda a, c, b: a + c + b, st.text(max_size=4),
                           st.sampled_from(CONTROL), st.text(max_size=4)))
scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                   st.integers(-3, 300), st.floats(), st.sampled_from([1e-39, 1e39, -0.0]),
                   text)
edge = st.sampled_from([2**70, -1, 10**9, 1025, 256, 255, 262144, 1e-39, 1e39, 5e-324,
                        float("nan"), float("inf"), -float("inf"), "1", "", " ", [], {}, [[]],
                        [2**64], {"type": "text"}, {"type": "json_object"}, True, False, None])
value = st.recursive(scalar | edge, lambda c: st.lists(c, max_size=3)
                     | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=6)
prompt = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=24).filter(
    str.strip) | text.filter(lambda t: t.strip() != "")


@st.composite
def valid_row(draw) -> dict:
    row: dict = ({"prompt": draw(prompt)} if draw(st.booleans()) else
                 {"messages": [{"role": "user", "content": draw(prompt)}]})
    opt = draw(st.fixed_dictionaries({}, optional={
        "max_tokens": st.integers(0, 8), "temperature": st.sampled_from([0, 1e-39, 0.8, 1e39]),
        "top_p": st.sampled_from([1e-300, 0.5, 1]), "top_k": st.integers(-1, 300),
        "min_p": st.sampled_from([0, 0.1, 1]), "seed": st.integers(0, 2**70),
        "n": st.integers(1, 3), "stop": st.lists(st.text(min_size=1, max_size=2), max_size=2),
        "stop_token_ids": st.lists(st.integers(0, 255), max_size=3),
        "min_tokens": st.integers(0, 3), "ignore_eos": st.booleans(),
        "include_stop_str_in_output": st.booleans(),
        "cache_salt": st.sampled_from(["a", "b", "\u00fc\u0000"])}))
    if opt.get("min_tokens", 0) > opt.get("max_tokens", 8):
        opt["min_tokens"] = opt.get("max_tokens", 8)
    return {**row, **opt}


hostile_row = st.dictionaries(st.sampled_from(KNOWN) | st.text(max_size=8), value, max_size=5)
row = st.one_of(valid_row(), valid_row(), valid_row(), valid_row(), hostile_row,
                st.builds(lambda r, k, v: {**r, k: v}, valid_row(), st.sampled_from(KNOWN),
                          value),
                st.builds(lambda r, k, v: {**r, k: v}, valid_row(), st.sampled_from(KNOWN), edge))
engine_options = st.fixed_dictionaries({
    "block_size": st.sampled_from([2, 4, 8, 16]), "num_blocks": st.integers(2, 40),
    "max_num_seqs": st.integers(1, 6), "max_num_batched_tokens": st.integers(1, 48),
    "enable_prefix_caching": st.booleans(), "max_model_len": st.integers(4, 64)})
defaults = st.builds(
    lambda mt, mn, n, t, stop, ids: SamplingParams(max_tokens=mt, min_tokens=min(mn, mt), n=n,
                                                   temperature=t, stop=stop,
                                                   stop_token_ids=ids),
    st.integers(0, 6), st.integers(0, 2), st.integers(1, 2), st.sampled_from([0, 0.9]),
    st.lists(st.text(min_size=1, max_size=2), max_size=1),
    st.lists(st.integers(0, 255), max_size=2))


@dataclass
class Case:
    """One generated run."""

    fmt: str  # jsonl, csv, parquet, openai
    rows: list  # dicts, or str for a raw (likely undecodable) JSONL line
    options: dict
    defaults: SamplingParams
    skip_invalid: bool
    order: str
    window: int
    output: str = "jsonl"  # jsonl or parquet
    keep: tuple[str, ...] = ()  # --keep-columns


cases = st.builds(
    Case, st.sampled_from(["jsonl", "csv", "parquet", "openai"]),
    st.lists(row | st.text(max_size=10).map(lambda t: "\x00raw" + t), min_size=1, max_size=4),
    engine_options, defaults, st.sampled_from([True, True, True, False]),
    st.sampled_from(["prefix", "input"]),
    st.integers(1, 4), st.sampled_from(["jsonl", "jsonl", "parquet"]),
    st.lists(st.sampled_from(["user", "temprature", "extra", "seed", "body"]), max_size=2,
             unique=True).map(tuple))


# ----------------------------------------------------------------------------- writing

def _cell(v) -> str:
    if v is None:
        return ""
    return v if isinstance(v, str) else json.dumps(v)


def write_case(case: Case, path, keep: int | None = None) -> list[int]:
    """Write ``case`` to ``path``; with ``keep``, every other row is an undecodable record
    spanning the same lines. Returns each row's location (line, or Parquet row)."""
    rows = [r if i in (keep, None) or keep is None else None for i, r in enumerate(case.rows)]
    if case.fmt in ("jsonl", "openai"):
        return _write_jsonl(case, rows, path)
    if case.fmt == "csv":
        return _write_csv(case, rows, path)
    return _write_parquet(case, rows, path)


def _jsonl_line(case: Case, i: int, r) -> str:
    if r is None:
        return "x"
    if isinstance(r, str):
        raw = r.removeprefix("\x00raw").replace("\n", " ").replace("\r", " ")
        return raw if raw.strip() else "[]"  # a blank line is skipped (not a row)
    if case.fmt == "openai":
        url = "/v1/chat/completions" if "messages" in r else "/v1/completions"
        r = {"custom_id": f"c{i}", "method": "POST", "url": url, "body": r}
    return json.dumps(r, ensure_ascii=i % 2 == 0)


def _write_jsonl(case: Case, rows: list, path) -> list[int]:
    lines = [_jsonl_line(case, i, r) for i, r in enumerate(rows)]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return list(range(1, len(lines) + 1))


def _columns(case: Case) -> list[str]:
    cols = ["prompt"]
    for r in case.rows:
        for k in r if isinstance(r, dict) else ():
            if k not in cols and k.strip() and k == k.strip():
                cols.append(k)
    return cols


def _write_csv(case: Case, rows: list, path) -> list[int]:
    cols = _columns(case)
    buf = io.StringIO()
    csv.writer(buf).writerow(cols)
    out, locations, line = [buf.getvalue()], [], 1 + _lines(buf.getvalue())
    for i, r in enumerate(rows):
        b = io.StringIO()
        full = case.rows[i] if isinstance(case.rows[i], dict) else {}
        cells = [_cell(full.get(c)) for c in cols]
        if r is None or isinstance(r, str):  # a record with one field too many
            span = _lines(_serialize(cells)) - 1
            cells = ["x" + "\n" * span] + [""] * len(cols)
        csv.writer(b).writerow(cells)
        out.append(b.getvalue())
        locations.append(line)
        line += _lines(b.getvalue())
    path.write_text("".join(out), encoding="utf-8")
    return locations


def _lines(text: str) -> int:
    """Physical lines as a reader with universal newlines counts them (\\r, \\n, \\r\\n)."""
    return len(re.findall("\r\n|\r|\n", text))


def _serialize(cells: list[str]) -> str:
    b = io.StringIO()
    csv.writer(b).writerow(cells)
    return b.getvalue()


def _write_parquet(case: Case, rows: list, path) -> list[int]:
    """Column types come from all of ``case.rows`` (so a file with other rows blanked out
    holds the same values as the full one); a column Arrow cannot type is JSON text."""
    cols = _columns(case)
    full = {c: [r.get(c) if isinstance(r, dict) else None for r in case.rows] for c in cols}
    arrays = {}
    for c in cols:
        vals = [r.get(c) if isinstance(r, dict) else None for r in rows]
        try:
            typ = pa.array(full[c]).type
            arrays[c] = pa.array(vals, typ)
        except (pa.ArrowException, OverflowError, ValueError, TypeError):
            arrays[c] = pa.array([None if v is None else _cell(v) for v in vals], pa.string())
    try:
        pq.write_table(pa.table(arrays), path)
    except pa.ArrowException:  # a type Parquet cannot store (an empty struct): as JSON text
        pq.write_table(pa.table({c: pa.array([None if isinstance(r, str) or r is None
                                              else _cell(r.get(c)) if r.get(c) is not None
                                              else None for r in rows], pa.string())
                                 for c in cols}), path)
    return list(range(len(rows)))


# ----------------------------------------------------------------------------- checking

def run(case: Case, path, out, model, tok):
    """``run_file`` of ``path``; returns the output records, or the InputError. The one
    warning an input may cause, a ``--keep-columns`` field no row has a value for, is checked
    here (it names kept fields only) instead of reaching the test run's summary."""
    engine = LLMEngine(EngineConfig(**case.options), model, tok)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run_file(str(path), str(out), engine.config, case.defaults,
                     RunOptions(skip_invalid=case.skip_invalid, show_progress=False,
                                order=case.order, window=case.window),
                     inputs=InputOptions(keep_columns=case.keep), engine=engine)
        except InputError as e:
            return e
        finally:
            _check_warnings(caught, case)

    if case.output == "parquet":
        return pq.read_table(out).to_pylist()
    return [json.loads(line) for line in out.read_text(encoding="utf-8").split("\n") if line]


def _check_warnings(caught: list[warnings.WarningMessage], case: Case) -> None:
    """Every ``--keep-columns`` warning names fields the case keeps; any other warning is
    passed on as it came."""
    for w in caught:
        text = str(w.message)
        if issubclass(w.category, UserWarning) and text.startswith("--keep-columns: no row of "):
            named = text.split(" has a value for ", 1)[1].split(" (its output column", 1)[0]
            assert set(named.split(", ")) <= set(case.keep), (text, case.keep)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _unit(case: Case) -> str:
    return "row" if case.fmt == "parquet" else "line"


def check_case(case: Case, tmp, model, tok) -> str:
    """Run ``case`` and check every invariant (AssertionError names the broken one).

    Returns:
        ``"exit 2"``, or ``"exit 0"`` plus counts of rows that ran and failed.
    """
    ext = {"openai": "jsonl"}.get(case.fmt, case.fmt)
    src, out = tmp / f"in.{ext}", tmp / f"run-out.{case.output}"
    locations = write_case(case, src)
    got = run(case, src, out, model, tok)
    if isinstance(got, InputError):
        assert not case.skip_invalid, f"InputError with --skip-invalid: {got}"
        assert "invalid row(s) of" in str(got), str(got)
        for problem in str(got).split("\n")[1:]:
            p = problem.strip()
            assert p.startswith(f"{src} {_unit(case)} ") or p.startswith("... and "), p
        return "exit 2"
    records = _by_row(case, got)
    ran = 0
    for i, recs in enumerate(records):
        where = f"{src} {_unit(case)} {locations[i]}: "
        error = _error(case, recs[0])
        if error is not None:
            assert error.startswith(where), (error, where)
            detail = error[len(where):]
            assert 'field "' in detail or detail.startswith(RECORD_PROBLEMS) or \
                "tokens" in detail, error
            continue
        ran += 1
        n = _samples(case.rows[i], case.defaults.n)
        if "response" in recs[0] and "finish_reason" not in recs[0]:
            assert len(recs) == 1 and len(recs[0]["response"]["body"]["choices"]) == n, recs
        else:
            assert len(recs) == n, (n, recs)
        if case.fmt == "parquet" and _int_id(case.rows[i]) is not None:
            continue  # its neighbours' default ids (their row numbers) could clash alone
        alone = _alone(case, i, tmp, model, tok)
        assert _summary(case, recs) == _summary(case, alone), (i, recs, alone)
    return f"exit 0 ran={ran} failed={len(records) - ran}"


def _samples(r, default: int) -> int:
    n = r.get("n") if isinstance(r, dict) else None
    if isinstance(n, str):  # a CSV cell is parsed as JSON
        try:
            n = json.loads(n)
        except ValueError:
            n = None
    if isinstance(n, (int, float)) and not isinstance(n, bool) and n >= 1:
        return int(n)
    return default


def _int_id(r) -> int | None:
    v = r.get("id") if isinstance(r, dict) else None
    return v if isinstance(v, int) or (isinstance(v, str) and v.strip().isdigit()) else None


def _alone(case: Case, i: int, tmp, model, tok) -> list[dict]:
    ext = {"openai": "jsonl"}.get(case.fmt, case.fmt)
    src, out = tmp / f"alone{i}.{ext}", tmp / f"alone{i}-out.{case.output}"
    write_case(case, src, keep=i)
    alone = Case(case.fmt, case.rows, case.options, case.defaults, True, case.order,
                 case.window, case.output, case.keep)
    got = run(alone, src, out, model, tok)
    assert not isinstance(got, InputError), got
    return _by_row(alone, got)[i]


def _by_row(case: Case, records: list[dict]) -> list[list[dict]]:
    """Group the output into one list per input row (samples of a row are consecutive)."""
    groups: list[list[dict]] = []
    k = 0
    for _ in case.rows:
        assert k < len(records), f"{len(records)} records for {len(case.rows)} rows"
        first = records[k]
        size = 1
        if first.get("sample_index") == 0:
            while k + size < len(records) and (records[k + size].get("sample_index") or 0) > 0:
                size += 1
        groups.append(records[k:k + size])
        k += size
    assert k == len(records), f"{len(records)} records for {len(case.rows)} rows"
    return groups


def _error(case: Case, record: dict) -> str | None:
    if "response" in record and "custom_id" in record and "finish_reason" not in record:
        return record["error"]["message"] if record["error"] else None
    return record.get("error")


def _summary(case: Case, recs: list[dict]):
    if "response" in recs[0] and "finish_reason" not in recs[0]:
        body = recs[0]["response"]["body"]
        return [(c.get("text", (c.get("message") or {}).get("content")), c["finish_reason"])
                for c in body["choices"]], body["usage"]["completion_tokens"]
    return [(r["text"], r["finish_reason"], r["prompt_tokens"], r["completion_tokens"],
             r.get("sample_index")) for r in recs]

