"""The text workloads in ``mlxpa bench``: rows that end at a stop string or EOS in every
system, counted as generated; ``--speculative-config`` and ``mlxpa-nospec``."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx_lm import stream_generate
from typer.testing import CliRunner

from mlxpa.bench.systems import SYSTEMS, run_system
from mlxpa.bench.workloads import Workload
from mlxpa.cli import app
from mlxpa.config import EngineConfig
from mlxpa.loader.models import load_model
from tests.tiny_models import save_tiny_model

MAX = 12


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("m") / "tiny", kind="gemma3")


@pytest.fixture(scope="module")
def greedy(folder):
    """The tiny model, its tokenizer, three prompts and their greedy texts (mlx-lm's
    ``stream_generate``, MAX tokens; the byte tokenizer: a character per token)."""
    model, tok, _ = load_model(EngineConfig(model=folder))
    prompts = [tok.encode(p) for p in ("Summary:", "JSON:", "Answer:")]
    tokens = [[r.token for r in stream_generate(model, tok, mx.array(p), max_tokens=MAX)]
              for p in prompts]
    texts = [tok.decode(t) for t in tokens]
    assert all(len(t) == MAX for t in texts)  # no EOS, no special token: the oracle holds
    return model, tok, prompts, tokens, texts


@pytest.mark.parametrize("system", ["mlxpa", "mlx-lm", "static"])
def test_rows_end_at_their_stop_strings_and_count_what_they_generated(greedy, system):
    """Row 0 stops at the token completing its stop string (its first match, wherever the
    string starts), row 1 at the earliest of two, row 2 has none and runs to its most
    tokens; every token up to the stopping one counts."""
    model, tok, prompts, _, texts = greedy
    stops = [(texts[0][4:6],), ("no such text", texts[1][7:9], texts[1][9:12]), ()]
    ends = [min(text.find(s) + len(s) for s in row if s in text) if row else MAX
            for text, row in zip(texts, stops)]
    assert ends[0] <= 6 and ends[1] <= 9
    wl = Workload("t", prompts, [MAX] * 3, {}, stop=stops, ignore_eos=False)
    assert not wl.exact_lengths and wl.num_output_tokens == 3 * MAX
    config = EngineConfig(kv_cache_memory_bytes=2**30 // 100)
    res = run_system(system, model, tok, wl, config)
    assert res.generation_tokens == sum(ends)
    one = run_system(system, model, tok, wl.head(1, MAX), config)
    assert one.generation_tokens == ends[0]


@pytest.mark.parametrize("system", ["mlxpa", "mlx-lm", "static"])
def test_eos_ends_a_row_unless_the_workload_ignores_it(greedy, system):
    """A token the model writes at position 5 made an EOS id: the row ends there (the EOS
    counted), and runs to its most tokens when the workload ignores EOS."""
    model, tok, prompts, tokens, _ = greedy
    eos = tokens[0][5]
    end = tokens[0].index(eos) + 1
    saved = set(tok.eos_token_ids)
    tok.eos_token_ids = {*saved, eos}
    try:
        config = EngineConfig(kv_cache_memory_bytes=2**30 // 100)
        stopping = Workload("t", prompts[:1], [MAX], {}, ignore_eos=False)
        assert run_system(system, model, tok, stopping, config).generation_tokens == end
        exact = Workload("t", prompts[:1], [MAX], {})
        assert exact.exact_lengths
        assert run_system(system, model, tok, exact, config).generation_tokens == MAX
    finally:
        tok.eos_token_ids = saved


def test_text_workload_bench_with_speculative_config_and_nospec(folder, tmp_path):
    """``--workload quote-qa`` against mlxpa-nospec: the workload's lengths are maxima, the
    speculative config reaches mlxpa's engine (as its figures record) and not
    mlxpa-nospec's, and each system counts the tokens it generated."""
    out = tmp_path / "b.json"
    spec = '{"method": "ngram", "num_speculative_tokens": 3}'
    r = CliRunner().invoke(app, ["bench", "--model", folder, "--workload", "quote-qa",
                                 "--num-prompts", "2", "--kv-memory", "0.02",
                                 "--speculative-config", spec, "--baselines",
                                 "mlxpa,mlxpa-nospec,mlx-lm", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "at most 128 output tokens" in r.stderr
    assert "speculative decoding (mlxpa / mlxpa-nospec):" in " ".join(r.stderr.split())
    data = json.loads(out.read_text())
    w = data["workload"]
    assert w["exact_output_lens"] is False and w["output_tokens"] == 128
    assert w["stop"] == {"quote-qa": ["\n\n"]} and w["max_tokens"] == {"quote-qa": 64}
    systems = data["systems"]
    assert systems["mlxpa"]["speculative_config"]["method"] == "ngram"
    assert systems["mlxpa"]["speculative_config"]["num_speculative_tokens"] == 3
    assert systems["mlxpa-nospec"]["speculative_config"] is None
    for f in systems.values():
        assert 2 <= f["generation_tokens"] <= 128
        assert f["output_tokens_per_s"] == pytest.approx(f["generation_tokens"]
                                                         / f["elapsed_s"])


@pytest.mark.parametrize("value,message", [
    ("{bad", "--speculative-config must be a JSON object, got '{bad'"),
    ('{"method": "draft_model"}', "--speculative-config: method must be one of ngram, suffix"),
    ('{"method": "ngram", "num_speculative_tokens": 0}',
     "--speculative-config: num_speculative_tokens must be an integer >= 1, got 0"),
    ('{"method": "ngram", "k": 2}', "--speculative-config: k must be absent"),
])
def test_bad_speculative_config_is_refused_naming_the_field(folder, value, message):
    r = CliRunner().invoke(app, ["bench", "--model", folder, "--speculative-config", value,
                                 "--baselines", "mlxpa,mlxpa-nospec"])
    assert r.exit_code == 2
    assert message in " ".join(r.stderr.split())


def test_speculative_config_is_an_engine_option_of_every_command():
    """One engine option: run, serve, generate and bench serve list it; bench serve hands it
    to the mlxpa server it starts (its JSON text) and to mlxpa-offline (its dict)."""
    from mlxpa.cli import options as opt
    from mlxpa.cli.bench_serve import _engine_kwargs

    assert "mlxpa-nospec" in SYSTEMS
    r = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert "mlxpa-nospec" in r.stdout and "--speculative-config" in r.stdout
    for command in (["run"], ["serve"], ["generate"], ["bench", "serve"]):
        r = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
        assert "--speculative-config" in r.stdout, command
    text = '{"method": "suffix"}'
    assert opt.engine_argv({"speculative_config": text, "max_num_seqs": 4}) == [
        "--speculative-config", text, "--max-num-seqs", "4"]
    config = opt.engine_config({"speculative_config": text})
    assert config.speculative_config.method == "suffix"
    kwargs = _engine_kwargs(config)
    assert kwargs["speculative_config"]["method"] == "suffix"
    json.dumps(kwargs)  # mlxpa-offline's engine goes into the JSON report
    assert EngineConfig(**kwargs).speculative_config == config.speculative_config
