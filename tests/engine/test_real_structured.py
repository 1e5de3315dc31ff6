"""Structured outputs on the real default model (Gemma 3 270M, float32): llguidance's
tokenizer built from the Hugging Face tokenizer, every constraint kind valid, the greedy
label equal to the unconstrained greedy label, choice_logprobs and logprobs equal to mlx-lm's
own forward pass."""

from __future__ import annotations

import json
import math
import re

import jsonschema
import mlx.core as mx
import pytest

from mlxpa.config import EngineConfig, SamplingParams
from mlxpa.engine import LLMEngine, PromptInput
from mlxpa.structured.spec import StructuredOutput

pytestmark = pytest.mark.real_model

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def chat(tok, text: str) -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": text}],
                                   add_generation_prompt=True)


def test_constraints_labels_and_probabilities(default_model):
    model, tok, _ = default_model
    shots = [("Awful, it stopped working on day two.", "negative"),
             ("Exactly what I needed, very happy.", "positive")]
    msgs = []
    for review, label in shots:
        msgs += [{"role": "user", "content": "Review: " + review},
                 {"role": "assistant", "content": label}]
    msgs.append({"role": "user", "content": "Review: It broke after a week and support "
                                            "never answered my emails."})
    label_ids = tok.apply_chat_template(msgs, add_generation_prompt=True)
    person = chat(tok, "Extract name and age as JSON: Maria Lopez, 34, from Madrid.")
    phone = chat(tok, "Write a phone number like (555) 123-4567.")
    choice = StructuredOutput.make("choice", ["positive", "negative"])
    items = [
        PromptInput("free", label_ids, SamplingParams(max_tokens=1)),
        PromptInput("label", label_ids, SamplingParams(max_tokens=4, structured_outputs=choice,
                                                       logprobs=3)),
        PromptInput("json", person, SamplingParams(
            max_tokens=60, structured_outputs=StructuredOutput.make("json", SCHEMA))),
        PromptInput("regex", phone, SamplingParams(
            max_tokens=20,
            structured_outputs=StructuredOutput.make("regex", r"\(\d{3}\) \d{3}-\d{4}"))),
    ]
    eng = LLMEngine(EngineConfig(block_size=16, num_blocks=256), model, tok)
    outs = {o.request_id: o for o in eng.generate(items)}
    assert outs["free"].text == "negative" == outs["label"].text  # an allowed argmax kept
    value = json.loads(outs["json"].text)
    jsonschema.validate(value, SCHEMA)
    assert value == {"name": "Maria Lopez", "age": 34}
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", outs["regex"].text)
    logits = model(mx.array(label_ids + tok.encode("negative", add_special_tokens=False))[None])
    lp = logits[0].astype(mx.float32)
    lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
    scores = outs["label"].choice_logprobs
    total = 0.0
    for c in ("positive", "negative"):
        cid = tok.encode(c, add_special_tokens=False)
        ref = model(mx.array(label_ids + cid)[None])[0].astype(mx.float32)
        ref = ref - mx.logsumexp(ref, axis=-1, keepdims=True)
        want = math.exp(sum(ref[len(label_ids) - 1 + j, t].item() for j, t in enumerate(cid)))
        assert abs(math.exp(scores[c]) - want) < 1e-4
        total += want
    assert total <= 1
    first = outs["label"].logprobs[0]
    row = lp[len(label_ids) - 1]
    assert abs(first.logprob - row[first.token_id].item()) < 1e-4
    assert [t for t, _ in first.top] == mx.argsort(-row)[:3].tolist()


def test_choice_label_is_a_canonical_tokenization(default_model):
    """The tester's row: the string grammar let greedy decoding spell " green" as " " then
    "green" (log-probability -19.7) although " red" was the most likely label; the choice
    grammar over canonical tokens writes " red", the argmax of ``choice_logprobs``."""
    model, tok, _ = default_model
    # (" blue.dark" in the tester's row: its "." token sends the whole choice list to the
    # text grammar, see test_choice_labels_with_punctuation_tokens_finish)
    choices = [" red", " green", " blue", "ü €"]
    so = StructuredOutput.make("choice", choices)
    eng = LLMEngine(EngineConfig(block_size=16, num_blocks=64), model, tok)
    (out,) = eng.generate([PromptInput("c", tok.encode("Pick a colour:"), SamplingParams(
        max_tokens=8, structured_outputs=so, logprobs=0))])
    assert out.token_ids == tok.encode(out.text, add_special_tokens=False)
    scores = out.choice_logprobs
    assert out.text == max(scores, key=scores.get) == " red"
    assert len({tok.encode(c, add_special_tokens=False)[0] for c in choices}) == len(choices)


def test_choice_labels_with_punctuation_tokens_finish(default_model):
    """Labels whose canonical tokens put ``,`` or ``.`` after a word (" Paris, France",
    " Paris."): llguidance's token grammar rejects such a sequence when its token is forced, so
    these choices fall back to the text grammar; every row ends with ``stop`` and its text is
    one of the choices, never an error row."""
    model, tok, _ = default_model
    prompt = tok.encode("The capital of France is")
    eng = LLMEngine(EngineConfig(block_size=16, num_blocks=64), model, tok)
    cases = {"comma": [" Paris, France", " Rome"], "period": [" Paris.", " Rome"],
             "words": [" Paris is nice", " Rome"]}
    outs = list(eng.generate([PromptInput(k, prompt, SamplingParams(
        max_tokens=8, structured_outputs=StructuredOutput.make("choice", v)))
        for k, v in cases.items()]))
    for out in outs:
        assert out.finish_reason == "stop", (out.request_id, out.error)
        assert out.text in cases[out.request_id]
    assert {o.request_id: o.text for o in outs}["period"] == " Paris."
