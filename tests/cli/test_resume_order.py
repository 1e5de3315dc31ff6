"""A stopped run, a stopped resume, then a resume to the end, on a tiny model, for JSONL and
Parquet outputs: the result equals an uninterrupted run's (the oracle), in input order, and
each intermediate file is complete and resumable. ``cached_tokens`` is compared apart: it
depends on which rows ran together."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from mlxpa.batch.run import RunOptions, run_file
from mlxpa.config import EngineConfig
from mlxpa.data import InputOptions
from mlxpa.engine import LLMEngine
from mlxpa.loader.models import load_model
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import save_tiny_model

NUM_ROWS = 12


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = save_tiny_model(tmp_path_factory.mktemp("m") / "tiny")
    return folder, load_model(EngineConfig(model=folder))


def rows_of(path: str) -> list[dict]:
    if path.endswith(".parquet"):
        return pq.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def run(tiny, src: str, out: str, resume: bool, stop_after: int | None = None) -> None:
    """Run ``src`` to ``out``; ``stop_after``: ask to stop after that many engine steps."""
    _, (model, tok, _) = tiny
    engine = LLMEngine(EngineConfig(num_blocks=64, block_size=4, max_num_seqs=3), model, tok)
    polls = iter(range(10**9))
    run_file(src, out, EngineConfig(), SamplingParams(ignore_eos=True),
             RunOptions(order="input", resume=resume, show_progress=False),
             inputs=InputOptions(), engine=engine,
             should_stop=lambda: stop_after is not None and next(polls) >= stop_after)


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_stopped_runs_then_resume_equal_an_uninterrupted_run(tmp_path, tiny, ext):
    # Every third row is long, so the rows after it finish first and are written after a gap.
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"row {i} of the job",
                                       "max_tokens": 12 if i % 3 == 0 else 2}) + "\n"
                           for i in range(NUM_ROWS)))
    ref, out = str(tmp_path / f"ref.{ext}"), str(tmp_path / f"out.{ext}")
    run(tiny, str(src), ref, resume=False)
    want = rows_of(ref)
    assert [r["id"] for r in want] == [f"r{i}" for i in range(NUM_ROWS)]
    run(tiny, str(src), out, resume=False, stop_after=13)
    first = [r["id"] for r in rows_of(out)]
    assert 0 < len(first) < NUM_ROWS and first != [r["id"] for r in want[:len(first)]]
    run(tiny, str(src), out, resume=True, stop_after=8)  # stopped again: left as written
    second = [r["id"] for r in rows_of(out)]
    assert second[:len(first)] == first and len(set(second)) == len(second) > len(first)
    run(tiny, str(src), out, resume=True)
    got = rows_of(out)
    assert [r["id"] for r in got] == [r["id"] for r in want]
    strip = [{k: v for k, v in r.items() if k != "cached_tokens"} for r in got]
    assert strip == [{k: v for k, v in r.items() if k != "cached_tokens"} for r in want]


def test_resume_with_nothing_to_run_still_sorts_without_loading_the_model(tmp_path,
                                                                         tokenizer_only):
    """A resume whose sort was cut short (every row there, out of order) sorts on the next
    resume, with no model load (the model folder has no weights)."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "prompt": f"p{i}"}) + "\n" for i in range(5)))
    lines = [json.dumps({"id": i, "text": f"t{i}", "finish_reason": "stop"}) + "\n"
             for i in range(5)]
    out = tmp_path / "out.jsonl"
    out.write_text("".join(lines[3:] + lines[:3]))
    run_file(str(src), str(out), EngineConfig(model=tokenizer_only),
             SamplingParams(), RunOptions(resume=True, show_progress=False))
    assert out.read_text() == "".join(lines)
