"""After an interrupt the report counts only what was written: requests in flight and the
finished samples of rows whose other samples still ran (a row is written whole) come out of
the counters (hand-computed case, no model)."""

from types import SimpleNamespace

from rich.console import Console

from mlxpa.batch.job import report_written
from mlxpa.config import SamplingParams
from mlxpa.engine.metrics import Counters
from mlxpa.request import Request, RequestOutput


def test_interrupt_takes_unwritten_samples_out_of_the_counters():
    running = Request("r", [1, 2, 3], SamplingParams(n=2), sample_index=1)
    running.output_token_ids = [7, 8]
    waiting = Request("w", [4, 5, 6, 7], SamplingParams())
    done = RequestOutput("r", "ab", [5, 6, 9], "length", num_prompt_tokens=3, sample_index=0)
    # written: one row of 10 prompt tokens, 4 generated; then the unwritten work above
    counters = Counters(requests=2, prompt_tokens=10 + 3 + 4, generation_tokens=4 + 3 + 2)
    engine = SimpleNamespace(counters=counters,
                             scheduler=SimpleNamespace(running=[running], waiting=[waiting]))
    console = Console(file=open("/dev/null", "w"))
    report_written(engine, 1, "out.jsonl", True, True, console, [[done]])
    assert (counters.requests, counters.prompt_tokens, counters.generation_tokens) == (1, 10, 4)
