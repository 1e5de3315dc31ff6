"""The real default model (Gemma 3 270M, float32): our engine's greedy output is identical
to ``mlx_lm.generate`` on the same converted folder and dtype (the oracle)."""

from __future__ import annotations

import json

import pytest
from mlx_lm import generate

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams

pytestmark = pytest.mark.real_model

PROMPTS = [
    "Question: What is the capital of France?\nAnswer:",
    "Classify the sentiment of the review as positive or negative.\n"
    "Review: It broke after a week and support never answered.\nSentiment:",
    "Question: Which planet is known as the red planet?\nAnswer:",
    "The three primary colours are",
]
MAX_TOKENS = 12


def test_greedy_matches_mlx_lm_generate(default_model):
    model, tok, _ = default_model
    refs = [generate(model, tok, p, max_tokens=MAX_TOKENS) for p in PROMPTS]
    # Small blocks and a small step budget: chunked prefill and several blocks per prompt.
    engine = LLMEngine(EngineConfig(block_size=8, num_blocks=64, max_num_batched_tokens=40),
                       model, tok)
    items = [EngineRequest(str(i), tok.encode(p), SamplingParams(max_tokens=MAX_TOKENS))
             for i, p in enumerate(PROMPTS)]
    outs = {int(o.request_id): o for o in engine.generate(items)}
    assert [outs[i].text for i in range(len(PROMPTS))] == refs
    assert "Paris" in outs[0].text
    engine.kv_cache_manager.check_invariants([])


def test_cli_on_examples_subset(default_model, tmp_path):
    """``run_file`` on example rows (shared instruction prefix, per-row stop and max_tokens)
    gives mlx-lm's greedy text cut at the first stop string."""
    from mlxpa.batch.run import RunOptions, run_file

    model, tok, _ = default_model
    rows = [json.loads(line) for line in open("examples/prompts.jsonl")][::6]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    engine = LLMEngine(EngineConfig(num_blocks=128), model, tok)
    run_file(str(src), str(out), EngineConfig(), SamplingParams(),
             RunOptions(show_progress=False), engine=engine)
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["id"] for g in got] == [r["id"] for r in rows]
    for r, g in zip(rows, got):
        ref = generate(model, tok, r["prompt"], max_tokens=r["max_tokens"])
        cut = min((ref.index(s) for s in r["stop"] if s in ref), default=len(ref))
        assert g["text"] == ref[:cut], r["id"]


def test_kernel_auto_and_reference_agree(default_model):
    """``--kernel auto`` (the dispatcher's choice on this machine) and ``reference`` give
    identical greedy outputs."""
    model, tok, _ = default_model
    items = [EngineRequest(str(i), tok.encode(p), SamplingParams(max_tokens=8))
             for i, p in enumerate(PROMPTS[:2])]
    texts = []
    for kernel in ("auto", "reference"):
        engine = LLMEngine(EngineConfig(num_blocks=32, attention_backend=kernel), model, tok)
        texts.append([o.text for o in sorted(engine.generate(items),
                                             key=lambda o: int(o.request_id))])
    assert texts[0] == texts[1]


def test_chat_template_rejection_is_a_row_error(default_model):
    """Gemma's template raises on roles that do not alternate: that row fails alone."""
    from mlxpa.batch.prompts import row_prompt
    from mlxpa.data import Row
    from mlxpa.inputs import InputProcessor

    _, tok, _ = default_model
    row = Row(0, 0, None, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
              {})
    with pytest.raises(ValueError, match="chat template rejected"):
        InputProcessor(tok).prompt_token_ids(row_prompt(row))
    ok = Row(1, 1, None, [{"role": "user", "content": "Name a colour."}], {})
    ids = InputProcessor(tok).prompt_token_ids(row_prompt(ok))
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.decode(ids).endswith("<start_of_turn>model\n")


def test_long_prompts_tiled_and_row_split_match_mlx_lm(default_model):
    """Prompts of over 600 tokens: prefill in query tiles across the 512-token window, MLP
    row halves on two CPU streams (at least 256 rows), greedy text still mlx-lm's."""
    model, tok, _ = default_model
    story = ("The lighthouse keeper wrote in his log every evening: the weather, the ships "
             "that passed, the colour of the sea and the birds on the rocks. ")
    prompts = [story * 22 + "On the last page he wrote", story * 21 + "The next morning"]
    assert all(len(tok.encode(p)) > 600 for p in prompts)
    refs = [generate(model, tok, p, max_tokens=8) for p in prompts]
    engine = LLMEngine(EngineConfig(num_blocks=128), model, tok)
    outs = {int(o.request_id): o for o in engine.generate(
        EngineRequest(str(i), tok.encode(p), SamplingParams(max_tokens=8))
        for i, p in enumerate(prompts))}
    assert [outs[i].text for i in range(len(prompts))] == refs
