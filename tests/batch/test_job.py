"""``report_written`` after an interrupt: the report counts only what was written. Requests in
flight and the finished samples of rows whose other samples still ran (a row is written
whole) come out of the counters: a hand-computed case (no model), and a stopped run whose
report's prompt tokens are those of the rows in its output."""

import json
from types import SimpleNamespace

from rich.console import Console

from mlxpa.batch.job import report_written
from mlxpa.config import EngineConfig
from mlxpa.engine.metrics import Counters
from mlxpa.request import Request, SampleOutput
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import save_tiny_model


def test_interrupt_takes_unwritten_samples_out_of_the_counters():
    running = Request("r", [1, 2, 3], SamplingParams(n=2), sample_index=1)
    running.output_token_ids = [7, 8]
    waiting = Request("w", [4, 5, 6, 7], SamplingParams())
    done = SampleOutput("r", "ab", [5, 6, 9], "length", num_prompt_tokens=3, sample_index=0)
    # written: one row of 10 prompt tokens, 4 generated; then the unwritten work above
    counters = Counters(requests=2, prompt_tokens=10 + 3 + 4, generation_tokens=4 + 3 + 2)
    engine = SimpleNamespace(counters=counters,
                             scheduler=SimpleNamespace(running=[running], waiting=[waiting]))
    console = Console(file=open("/dev/null", "w"))
    report_written(engine, 1, "out.jsonl", True, True, console, [[done]])
    assert (counters.requests, counters.prompt_tokens, counters.generation_tokens) == (1, 10, 4)


def test_interrupted_report_counts_what_was_written(tmp_path):
    """After a stop request the report's prompt tokens are those of the rows in the file,
    and the requests dropped in flight are said (the issue saw 1,432 counted, 1,022 written)."""
    from mlxpa.batch.run import RunOptions, run_file

    folder = save_tiny_model(tmp_path / "tiny")
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"row {i} " + "x" * (5 + i)}) + "\n"
                           for i in range(8)))
    out = tmp_path / "out.jsonl"
    polls = iter(range(10**6))
    console = Console(stderr=True, record=True, width=200)
    config = EngineConfig(model=folder, max_num_seqs=2, kv_cache_memory_bytes=2**30 // 100)
    stats = run_file(str(src), str(out), config, SamplingParams(max_tokens=6, ignore_eos=True),
                     RunOptions(order="input"), console=console,
                     should_stop=lambda: next(polls) >= 12)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert 0 < len(rows) < 8
    assert stats.prompt_tokens == sum(r["prompt_tokens"] for r in rows)
    text = console.export_text()
    assert "interrupted: dropped" in text and f"wrote {len(rows)} row(s) to {out}" in text



def test_the_tally_counts_the_answers_it_computed_not_the_records_it_wrote(tmp_path,
                                                                           monkeypatch):
    """The tally takes each row's answers as computed, before they are written: records
    without them (as a writer might shape them) change nothing it counts."""
    from mlxpa.annotation.questions import QuestionSet, parse_question_set
    from mlxpa.annotation.tally import AnswerTally
    from mlxpa.batch import job
    from mlxpa.batch.run import RunOptions, run_file
    from mlxpa.data import InputOptions

    folder = save_tiny_model(tmp_path / "tiny")
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"document {i}", "gold": ["yes", "no"][i % 2]})
                           + "\n" for i in range(3)))
    problems: list[str] = []
    qs = parse_question_set([{"name": "ok", "type": "yes_no", "question": "Fine?"}], "q",
                            problems)
    assert isinstance(qs, QuestionSet) and not problems
    written = job.result_records
    monkeypatch.setattr(job, "result_records", lambda *a, **k: [
        {key: v for key, v in r.items() if key != "answers"} for r in written(*a, **k)])
    tally = AnswerTally()
    config = EngineConfig(model=folder, kv_cache_memory_bytes=2**30 // 100)
    run_file(str(src), str(tmp_path / "out.jsonl"), config, SamplingParams(),
             RunOptions(show_progress=False), inputs=InputOptions(questions=qs,
                                                                  gold_column="gold"),
             answers=tally)
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all("answers" not in r for r in rows)
    question, logprobs, gold = tally.golded()["ok"]
    assert tally.rows == 3 and question is qs.questions[0]
    assert gold.tolist() == [0, 1, 0] and logprobs.shape == (3, 2)
