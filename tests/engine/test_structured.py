"""Constrained decoding in the engine (tiny random models): every constraint kind, the mask
leaves an allowed argmax alone, and constraints survive preemption, chunked prefill, prefix
hits, n > 1 forks, stop strings, min_tokens and max_tokens."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams, StructuredOutput
from mlxpa.structured.spec import check
from tests.tiny_models import byte_tokenizer, tiny_gemma3, tiny_llama

SCHEMA = {"type": "object", "properties": {
    "label": {"enum": ["pos", "neg"]}, "ok": {"type": "boolean"},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["label", "ok", "tags"], "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False}}
CONSTRAINTS = {
    "regex": StructuredOutput.make("regex", "[0-9]{2,3}-(ab|cd)"),
    "choice": StructuredOutput.make("choice", ["yes", "no", "maybe"]),
    "json": StructuredOutput.make("json", SCHEMA),
    "grammar": StructuredOutput.make("grammar", 'start: "ab" ("c" | "d") ("c" | "d") "!"'),
    "gbnf": StructuredOutput.make("grammar", 'root ::= "x" [0-9] [0-9]'),
}
PROMPTS = ["hello world, this is a test", "a", "The quick brown fox jumps over the lazy dog. " * 2,
           "0123456789abcde", "short prompt"]


def valid(kind: str, text: str) -> bool:
    if kind == "regex":
        return re.fullmatch("[0-9]{2,3}-(ab|cd)", text) is not None
    if kind == "choice":
        return text in ("yes", "no", "maybe")
    if kind == "json":
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    if kind == "grammar":
        return re.fullmatch("ab[cd][cd]!", text) is not None
    return re.fullmatch("x[0-9][0-9]", text) is not None


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model(request):
    return tiny_llama() if request.param == "llama" else tiny_gemma3(sliding_window=8)


def _rid(key) -> str:
    """The request id of a test's key: ``("json", 0)`` -> ``"json/0"``."""
    return "/".join(map(str, key)) if isinstance(key, tuple) else str(key)


def run(model, config, items, tok=None):
    tok = tok or byte_tokenizer()
    eng = LLMEngine(config, model, tok)
    outs, keys = {}, {_rid(it[0]): it[0] for it in items}  # the engine's ids are strings
    for o in eng.generate(EngineRequest(_rid(key), *rest) for key, *rest in items):
        outs.setdefault(keys[o.request_id], []).append(o)
    eng.kv_cache_manager.check_invariants([])
    return eng, {k: sorted(v, key=lambda o: o.sample_index) for k, v in outs.items()}


def constrained_items(tok, params=None, n_prompts=5):
    items = []
    for kind, so in CONSTRAINTS.items():
        for j, p in enumerate(PROMPTS[:n_prompts]):
            sp = params or SamplingParams(max_tokens=60)
            items.append(((kind, j), tok.encode(p), SamplingParams(**{
                **{f: getattr(sp, f) for f in sp.__slots__}, "structured_outputs": so})))
    return items


CONFIGS = {
    "plain": EngineConfig(block_size=8, num_blocks=128),
    "chunked": EngineConfig(block_size=8, num_blocks=128, max_num_batched_tokens=7),
    "preempt": EngineConfig(block_size=4, num_blocks=48, max_num_batched_tokens=32),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_every_kind_valid_and_same_under_chunking_and_preemption(model, name):
    tok = byte_tokenizer()
    items = constrained_items(tok)
    _, ref = run(model, CONFIGS["plain"], items)
    eng, outs = run(model, CONFIGS[name], items)
    if name == "preempt":
        assert eng.counters.num_preemptions > 0
    for key, (out,) in outs.items():
        assert out.finish_reason == "stop", (key, out.text)
        assert valid(key[0], out.text), (key, out.text)
        assert out.token_ids == ref[key][0].token_ids, key


def test_mask_keeps_an_allowed_argmax(model):
    """Greedy output under a constraint the unconstrained output already satisfies is the
    same token for token (the mask never changes an allowed argmax)."""
    tok = byte_tokenizer()
    free = [(j, tok.encode(p), SamplingParams(max_tokens=24, ignore_eos=True))
            for j, p in enumerate(PROMPTS)]
    _, ref = run(model, CONFIGS["plain"], free)
    items, checked = [], 0
    for j, p in enumerate(PROMPTS):
        toks = ref[j][0].token_ids
        if any(t < 3 for t in toks):  # a special token: no text constraint admits it
            continue
        text = ref[j][0].text
        for k, so in enumerate([StructuredOutput.make("regex", "(?s).{0,100}"),
                                StructuredOutput.make("choice", [text, "zz" + text]),
                                StructuredOutput.make("regex", re.escape(text[:5]) + ".*")]):
            items.append(((j, k), tok.encode(p),
                          SamplingParams(max_tokens=24, structured_outputs=so)))
        checked += 1
    assert checked >= 3
    _, outs = run(model, CONFIGS["plain"], items)
    for (j, k), (out,) in outs.items():
        n = len(out.token_ids)
        assert out.token_ids == ref[j][0].token_ids[:n] and n >= (24 if k != 1 else len(
            ref[j][0].token_ids)), (j, k)


def test_n_forks_prefix_hits_stop_strings_min_and_max_tokens(model):
    tok = byte_tokenizer()
    long = "a shared prefix that fills a few blocks of eight tokens. "
    so = CONSTRAINTS["json"]
    items = [
        ("n", tok.encode(long + "one"), SamplingParams(max_tokens=60, n=3, temperature=1.0,
                                                       seed=5, structured_outputs=so)),
        ("hit", tok.encode(long + "two"), SamplingParams(max_tokens=60, structured_outputs=so)),
        ("stop", tok.encode("x"),
         SamplingParams(max_tokens=60, structured_outputs=so, stop=['":'])),
        ("min", tok.encode("y"), SamplingParams(
            max_tokens=30, min_tokens=12,
            structured_outputs=StructuredOutput.make("regex", "[a-c]+"))),
        ("max", tok.encode("z"), SamplingParams(max_tokens=4, structured_outputs=so)),
    ]
    eng, outs = run(model, EngineConfig(block_size=8, num_blocks=128, max_num_seqs=2), items)
    assert len(outs["n"]) == 3
    for out in outs["n"] + outs["hit"]:
        assert out.finish_reason == "stop" and valid("json", out.text), out.text
    assert outs["hit"][0].num_cached_tokens >= 48  # the prompt's shared full blocks
    (stop,) = outs["stop"]
    assert stop.finish_reason == "stop" and stop.text == '{"label'
    (mn,) = outs["min"]
    assert len(mn.token_ids) >= 12 and re.fullmatch("[a-c]+", mn.text)
    (mx_,) = outs["max"]
    assert mx_.finish_reason == "length" and len(mx_.token_ids) == 4
    assert eng.counters.mask_steps > 0 and eng.counters.mask_time_s > 0


def test_grammar_outranks_min_tokens_when_it_must_end(model):
    """``min_tokens`` bans EOS and stop ids only while the grammar admits another token
    (vLLM's rule, vllm-project/vllm#54218): a grammar that can only end (or only continue with
    a stop id) ends the row with ``stop`` below ``min_tokens``; its output stays in the
    grammar, an EOS leaves no text, and a grammar that still offers a token is extended."""
    tok = byte_tokenizer()
    x, y = tok.encode("x")[-1], tok.encode("y")[-1]
    regex = StructuredOutput.make("regex", "a[xy]?")
    items = [
        ("only_stop_ids", tok.encode("hi"), SamplingParams(
            max_tokens=20, min_tokens=5, stop_token_ids=[x, y],
            structured_outputs=StructuredOutput.make("regex", "a[xy]"))),
        ("one_choice", tok.encode("hi"), SamplingParams(
            max_tokens=20, min_tokens=5,
            structured_outputs=StructuredOutput.make("choice", ["ab"]))),
        ("longer_choice", tok.encode("hi"), SamplingParams(
            max_tokens=20, min_tokens=5,
            structured_outputs=StructuredOutput.make("choice", ["ab", "abc"]))),
        ("boolean", tok.encode("hi"), SamplingParams(
            max_tokens=20, min_tokens=15, structured_outputs=StructuredOutput.make(
                "json", {"type": "boolean"}))),
    ] + [(f"seed{s}", tok.encode("hi"), SamplingParams(
        max_tokens=20, min_tokens=5, temperature=1.0, seed=s, stop_token_ids=[x, y],
        structured_outputs=regex)) for s in range(6)]
    _, outs = run(model, CONFIGS["plain"], items)
    assert all(o.finish_reason == "stop" for (o,) in outs.values()), outs
    assert outs["only_stop_ids"][0].text in ("ax", "ay")  # stop ids are text below min
    # choice rows are scored, not decoded: min_tokens does not apply, and a label extending
    # another ("abc" extends "ab") never scores higher, so greedy takes the shorter
    assert outs["one_choice"][0].text == "ab"
    assert outs["longer_choice"][0].text == "ab"
    assert outs["boolean"][0].text in ("true", "false")
    seeded = [outs[f"seed{s}"][0] for s in range(6)]
    assert all(o.text in ("a", "ax", "ay") for o in seeded), [o.text for o in seeded]
    for o in seeded:  # an EOS below min_tokens ends the row as an EOS does: no text
        assert (o.token_ids[-1] in tok.eos_token_ids) == (o.text == "a")


@pytest.mark.parametrize("kind,value", [
    ("regex", "[a-"), ("json", {"type": "objekt"}), ("json", "{not json"),
    ("grammar", "start: (("), ("choice", []), ("choice", ["a", 3])])
def test_bad_constraints_are_named(kind, value):
    try:
        so = StructuredOutput.make(kind, value)
    except ValueError as e:
        assert str(e)
        return
    problem = check(so)
    assert problem is not None and kind in problem.lower()
