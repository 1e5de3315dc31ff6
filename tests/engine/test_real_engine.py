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
    engine = LLMEngine(EngineConfig(num_blocks=768), model, tok)  # blocks of 3 layers
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
    engine = LLMEngine(EngineConfig(num_blocks=768), model, tok)  # blocks of 3 layers
    outs = {int(o.request_id): o for o in engine.generate(
        EngineRequest(str(i), tok.encode(p), SamplingParams(max_tokens=8))
        for i, p in enumerate(prompts))}
    assert [outs[i].text for i in range(len(prompts))] == refs


def test_readme_annotation_example_on_the_default_model(default_model, tmp_path):
    """The README's two questions over ``examples/reviews.jsonl``: every answer is the row's
    gold label, and each question's label log-probabilities equal mlx-lm's own forward pass
    over the question's text and the label (teacher forcing, float64)."""
    import math

    import mlx.core as mx
    import numpy as np

    from mlxpa.annotation.questions import load_questions
    from mlxpa.annotation.render import prompt_text
    from mlxpa.batch.run import RunOptions, run_file
    from mlxpa.data import InputOptions

    model, tok, _ = default_model
    out = tmp_path / "answers.jsonl"
    qs = load_questions("examples/questions.json")
    run_file("examples/reviews.jsonl", str(out), EngineConfig(), SamplingParams(),
             RunOptions(show_progress=False), inputs=InputOptions(questions=qs),
             engine=LLMEngine(EngineConfig(num_blocks=256), model, tok))
    rows = [json.loads(line) for line in open("examples/reviews.jsonl")]
    got = [json.loads(line) for line in out.read_text().splitlines()]
    for r, g in zip(rows, got):
        assert {n: a["label"] for n, a in g["answers"].items()} == r["gold"], r["id"]
    r, g = rows[0], got[0]
    for q in qs.questions:  # each label as the tokenizer writes text + label, from the first
        text = prompt_text(r["prompt"], q, qs.preamble)  # position where any label leaves
        ids = tok.encode(text)  # the text's own tokens
        fulls = {c: tok.encode(text + c) for c in q.labels}
        start = min(next((k for k, (a, b) in enumerate(zip(f, ids)) if a != b), len(ids))
                    for f in fulls.values())
        for c, full in fulls.items():  # the label's positions only: [k, V], not [len, V]
            rows = model(mx.array(full)[None])[0][start - 1:len(full) - 1]
            logits = np.array(rows.astype(mx.float32), np.float64)
            top = logits.max(-1, keepdims=True)
            lp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
            want = math.fsum(lp[j][t] for j, t in enumerate(full[start:]))
            assert abs(g["answers"][q.name]["logprobs"][c] - want) < 2e-3, (q.name, c)


def test_chat_questions_share_the_conversation_on_gemmas_template(default_model):
    """On the default model's own chat template, a chat document's questions share every
    token up to the user turn's text end (the preamble, merged into the first user turn by
    Gemma's template, and the conversation); each question adds its words and the template's
    turn change (oracle: the template rendered by the tokenizer itself)."""
    from mlxpa.annotation.questions import load_questions
    from mlxpa.annotation.render import question_messages
    from mlxpa.data import Row
    from mlxpa.inputs import InputProcessor
    from mlxpa.inputs.processor import question_prompts

    _, tok, _ = default_model
    qs = load_questions("examples/questions.json")
    conv = [{"role": "user", "content": "The soup was cold and bland."}]
    req = InputProcessor(tok).question_request(
        "x", *question_prompts(Row(0, 0, None, conv, {}, questions=qs)))
    rendered = [tok.encode(tok.apply_chat_template(question_messages(conv, q, qs.preamble),
                                                   tokenize=False, add_generation_prompt=True),
                           add_special_tokens=False) for q in qs.questions]
    assert [list(q.prompt_token_ids) for q in req.questions] == rendered
    doc = tok.decode(req.prompt_token_ids)
    assert doc.endswith("The soup was cold and bland.\n") and qs.preamble in doc
    for q, ids in zip(qs.questions, rendered):
        tail = tok.decode(ids[len(req.prompt_token_ids):])
        assert tail == q.suffix.strip() + "<end_of_turn>\n<start_of_turn>model\n"
