"""Structured outputs on the real default model (Gemma 3 270M, float32): llguidance's
tokenizer built from the Hugging Face tokenizer, every constraint kind valid, the greedy
label equal to the unconstrained greedy label, choice_logprobs and logprobs equal to mlx-lm's
own forward pass; where Gemma's tokenizer ends a label after a prompt (the join rule equals
encoding the prompt's text and the label together), and labels that share first tokens
scored against mlx-lm in float64, the greedy label their argmax."""

from __future__ import annotations

import json
import math
import re

import jsonschema
import mlx.core as mx
import pytest

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams, StructuredOutput

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
        EngineRequest("free", label_ids, SamplingParams(max_tokens=1)),
        EngineRequest("label", label_ids, SamplingParams(max_tokens=4, structured_outputs=choice,
                                                       logprobs=3)),
        EngineRequest("json", person, SamplingParams(
            max_tokens=60, structured_outputs=StructuredOutput.make("json", SCHEMA))),
        EngineRequest("regex", phone, SamplingParams(
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
    "green" (log-probability -19.7) although " red" was the most likely label; scored in
    their canonical tokenizations, the row's text is " red", the argmax of
    ``choice_logprobs``."""
    model, tok, _ = default_model
    # (" blue.dark" in the tester's row: its "." token sends the whole choice list to the
    # text grammar, see test_choice_labels_with_punctuation_tokens_finish)
    choices = [" red", " green", " blue", "ü €"]
    so = StructuredOutput.make("choice", choices)
    eng = LLMEngine(EngineConfig(block_size=16, num_blocks=64), model, tok)
    (out,) = eng.generate([EngineRequest("c", tok.encode("Pick a colour:"), SamplingParams(
        max_tokens=8, structured_outputs=so, logprobs=0))])
    assert out.token_ids == tok.encode(out.text, add_special_tokens=False)
    scores = out.choice_logprobs
    assert out.text == max(scores, key=scores.get) == " red"
    assert len({tok.encode(c, add_special_tokens=False)[0] for c in choices}) == len(choices)


def test_choice_labels_with_punctuation_tokens_finish(default_model):
    """Labels whose canonical tokens put ``,`` or ``.`` after a word (" Paris, France",
    " Paris.", which llguidance's token grammar could not force when choices were decoded)
    are scored like any others: every row ends with ``stop`` and its text is one of the
    choices, never an error row."""
    model, tok, _ = default_model
    prompt = tok.encode("The capital of France is")
    eng = LLMEngine(EngineConfig(block_size=16, num_blocks=64), model, tok)
    cases = {"comma": [" Paris, France", " Rome"], "period": [" Paris.", " Rome"],
             "words": [" Paris is nice", " Rome"]}
    outs = list(eng.generate([EngineRequest(str(k), prompt, SamplingParams(
        max_tokens=8, structured_outputs=StructuredOutput.make("choice", v)))
        for k, v in cases.items()]))
    for out in outs:
        assert out.finish_reason == "stop", (out.request_id, out.error)
        assert out.text in cases[out.request_id]
    assert {o.request_id: o.text for o in outs}["period"] == " Paris."


def test_labels_join_the_prompt_as_gemmas_tokenizer_writes_them(default_model):
    """The rule of :mod:`mlxpa.structured.labels` on Gemma's SentencePiece BPE: for text
    prompts (BOS added, a prompt ending in one or two spaces, in a newline, in a word) and a
    chat prompt (after ``<start_of_turn>model\\n``), the prompt's tokens up to where the
    labels start, then each label's tokens, are exactly the tokenizer's encoding of the
    prompt's text followed by the label's."""
    from mlxpa.batch.prompts import row_prompt
    from mlxpa.data.rows import Row
    from mlxpa.inputs import InputProcessor
    from mlxpa.structured.labels import LabelJoiner

    _, tok, _ = default_model
    hf = tok._tokenizer
    joiner = LabelJoiner(tok)
    labels = ["positive", " positive", "Paris", " Paris, France", "123", "\n", "é", "日本"]
    texts = {p: p for p in ["Sentiment:", "Answer: ", "Answer:  ", "x", "Q: 2+2=\nA:",
                            "ends with a newline\n", "The capital of France is"]}
    chat = [{"role": "user", "content": "Review: works great. Label it."}]
    texts["chat"] = hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    healed = 0
    for name, text in texts.items():
        row = Row(0, 0, None, chat, {}) if name == "chat" else Row(0, 0, text, None, {})
        ids = InputProcessor(tok).prompt_token_ids(row_prompt(row))
        joined = joiner.join(ids, labels)
        healed += joined.start < len(ids)
        for label, tokens in zip(labels, joined.tokens):
            whole = hf.encode(text + label, add_special_tokens=name != "chat")
            assert ids[:joined.start] + list(tokens) == whole, (name, label)
    assert healed >= 3  # "Answer: ", "Answer:  " and the newline take the labels' join


def test_labels_sharing_first_tokens_scored_against_mlx_lm(default_model):
    """Five sentiment labels, two pairs sharing a first token ("very positive" / "very
    negative", and Gemma's own splits), after few-shot chat prompts: every label's score
    equals the float64 teacher-forced sum of mlx-lm's own forward pass, choice_probs is its
    softmax, and the greedy text is the argmax in every row."""
    import numpy as np

    from mlxpa.engine.choice_scores import label_probs

    model, tok, _ = default_model
    labels = ["very positive", "positive", "neutral", "negative", "very negative"]
    firsts = [tok.encode(c, add_special_tokens=False)[0] for c in labels]
    assert firsts[0] == firsts[4]
    so = StructuredOutput.make("choice", labels)
    reviews = ["It broke after a week and support never answered.", "Best kettle ever!",
               "It is a tent.", "Works, I guess."]
    prompts = [chat(tok, "Label the review as very positive, positive, neutral, negative or "
                         "very negative.\n\nReview: " + r) for r in reviews]
    eng = LLMEngine(EngineConfig(block_size=16, num_blocks=256), model, tok)
    outs = {int(o.request_id): o for o in eng.generate(
        EngineRequest(str(i), p, SamplingParams(max_tokens=8, structured_outputs=so, logprobs=0))
        for i, p in enumerate(prompts))}
    for i, ids in enumerate(prompts):
        out = outs[i]
        tokens = [tok.encode(c, add_special_tokens=False) for c in labels]
        scores = []
        for cid in tokens:
            logits = np.array(model(mx.array(ids + cid)[None])[0].astype(mx.float32),
                              dtype=np.float64)
            top = logits.max(axis=-1, keepdims=True)
            lp = logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
            scores.append(sum(lp[len(ids) - 1 + j, t] for j, t in enumerate(cid)))
        probs, outside = label_probs(scores, tokens)
        for c, want, p in zip(labels, scores, probs):
            assert abs(out.choice_logprobs[c] - want) < 2e-3, (i, c)
            assert abs(out.choice_probs[c] - p) < 1e-3, (i, c)
        assert abs(out.choice_outside_prob - outside) < 1e-3
        assert out.text == labels[int(np.argmax(scores))], (i, out.choice_logprobs)
        assert out.token_ids == tokens[labels.index(out.text)]
        assert len(out.logprobs) == len(out.token_ids)
