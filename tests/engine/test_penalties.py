"""Penalties and ``logit_bias`` through the engine against mlx-lm's own logits processors
(``mlx_lm.sample_utils.make_logits_processors``) driven by ``generate_step``: greedy token ids
identical on tiny random models, every row with its own settings in one batched run.

Where the definitions agree and where they differ: mlx-lm's repetition penalty divides a
positive logit and multiplies a negative one of every token in its window, as vLLM's does
over prompt and output, so with a window covering the whole context
(``repetition_context_size`` = 10**6) the two agree, and so do the ``logit_bias`` processors.
mlx-lm's presence and frequency penalties count the prompt too (within the same kind of
window, 20 tokens by default), where vLLM's and OpenAI's count the output only: the test
hands mlx-lm's processors the output tokens alone (``tokens[len(prompt):]``), which is where
they agree.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_logits_processors

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import byte_tokenizer, tiny_gemma3, tiny_llama

MAX_TOKENS = 16
WHOLE = 10**6  # a window covering the whole context


def output_only(processor, num_prompt: int):
    """mlx-lm's processor over the output tokens only (vLLM's presence/frequency)."""
    return lambda tokens, logits: processor(tokens[num_prompt:], logits)


def mlx_lm_processors(sp: SamplingParams, num_prompt: int) -> list:
    procs = make_logits_processors(
        logit_bias=sp.logit_bias,
        repetition_penalty=sp.repetition_penalty if sp.repetition_penalty != 1 else None,
        repetition_context_size=WHOLE)
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(sp, name)
        if value:
            (proc,) = make_logits_processors(**{name: value, name.replace(
                "penalty", "context_size"): WHOLE})
            procs.append(output_only(proc, num_prompt))
    return procs


def mlx_lm_greedy(model, ids: list[int], sp: SamplingParams) -> list[int]:
    return [int(t) for t, _ in generate_step(
        mx.array(ids), model, max_tokens=MAX_TOKENS,
        logits_processors=mlx_lm_processors(sp, len(ids)))]


ROWS = [
    ("hello world, this is a test", SamplingParams(repetition_penalty=1.8)),
    ("aaaa bbbb aaaa", SamplingParams(repetition_penalty=0.5)),
    ("The quick brown fox", SamplingParams(presence_penalty=2.0)),
    ("0123456789abcde", SamplingParams(frequency_penalty=1.5)),
    ("short prompt", SamplingParams()),  # sets nothing, batched with the others
    ("hello world, this is a test", SamplingParams(
        repetition_penalty=1.3, presence_penalty=-1.0, frequency_penalty=0.8,
        logit_bias={ord("e") - 29: 3.0, ord(" ") - 29: -5.0})),
    ("zz", SamplingParams(logit_bias={40: 4.0, 41: 4.0})),
]


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model(request):
    return tiny_llama() if request.param == "llama" else tiny_gemma3(sliding_window=8)


@pytest.mark.parametrize("config", [
    EngineConfig(block_size=8, num_blocks=64),
    EngineConfig(block_size=8, num_blocks=64, max_num_batched_tokens=7),  # chunked prefill
    EngineConfig(block_size=8, num_blocks=16, max_num_batched_tokens=32),  # preemption
], ids=["plain", "chunked", "preempt"])
def test_greedy_matches_mlx_lm_logits_processors(model, config):
    tok = byte_tokenizer(eos_id=-1)  # no EOS: every row runs max_tokens
    ids = [tok.encode(p) for p, _ in ROWS]
    params = [SamplingParams(max_tokens=MAX_TOKENS, repetition_penalty=sp.repetition_penalty,
                             presence_penalty=sp.presence_penalty,
                             frequency_penalty=sp.frequency_penalty, logit_bias=sp.logit_bias)
              for _, sp in ROWS]
    eng = LLMEngine(config, model, tok)
    outs = {int(o.request_id): o for o in eng.generate(
        EngineRequest(str(i), p, sp) for i, (p, sp) in enumerate(zip(ids, params)))}
    changed = 0
    for i, (p, sp) in enumerate(zip(ids, params)):
        want = mlx_lm_greedy(model, p, sp)
        assert outs[i].token_ids == want, f"row {i}"
        changed += want != mlx_lm_greedy(model, p, SamplingParams())
    assert changed >= 4  # the settings change most rows' text, so the check can fail
    if config.num_blocks == 16:
        assert eng.counters.num_preemptions > 0
    assert len(eng.runner.penalties) == 0  # freed with the finished requests


def test_logit_bias_forces_and_bans_a_token(model):
    tok = byte_tokenizer(eos_id=-1)
    ids = tok.encode("hello world")
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=32), model, tok)
    plain, forced, banned = (next(iter(eng.generate([EngineRequest("0", ids, sp)])))
                             for sp in (SamplingParams(max_tokens=8),
                                        SamplingParams(max_tokens=8, logit_bias={77: 100}),
                                        SamplingParams(max_tokens=8, temperature=1.0, seed=1,
                                                       logit_bias={77: 100})))
    assert forced.token_ids == [77] * 8 and banned.token_ids == [77] * 8
    top = plain.token_ids[0]
    ban = next(iter(eng.generate([EngineRequest("0", ids, SamplingParams(
        max_tokens=8, logit_bias={top: -100}))])))
    assert top not in ban.token_ids


def test_a_bias_id_outside_the_vocabulary_is_a_row_error(model):
    tok = byte_tokenizer(eos_id=-1)
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=32), model, tok)
    eng.add_request("0", tok.encode("hi"), SamplingParams(logit_bias={256: 1.0}))
    (out,) = eng.step()  # outputs leave the engine through step() only
    assert out.finish_reason == "abort"
    assert out.error == ('field "logit_bias": token id 256 is outside the model\'s '
                         "vocabulary (256 ids, 0..255)")


def test_a_bias_never_lifts_the_grammar_mask(model):
    """Order: the grammar mask, then ``logit_bias``: +100 on a letter the regex forbids
    leaves it impossible, +100 on an allowed one picks it at every position; the repetition
    penalty applies to what the grammar allows (the text still matches)."""
    import re

    from mlxpa.sampling_params import StructuredOutput

    tok = byte_tokenizer()
    digits = StructuredOutput.make("regex", "[0-9]{6}")
    ids = tok.encode("number:")
    (seven,), (x,) = tok.encode("7", add_special_tokens=False), tok.encode(
        "x", add_special_tokens=False)
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=32), model, tok)
    outs = list(eng.generate([
        EngineRequest("0", ids, SamplingParams(max_tokens=8, structured_outputs=digits,
                                           logit_bias={x: 100.0})),
        EngineRequest("1", ids, SamplingParams(max_tokens=8, structured_outputs=digits,
                                           logit_bias={seven: 100.0})),
        EngineRequest("2", ids, SamplingParams(max_tokens=8, structured_outputs=digits,
                                           repetition_penalty=2.0))]))
    by_id = {int(o.request_id): o.text for o in outs}
    assert re.fullmatch("[0-9]{6}", by_id[0]) and "x" not in by_id[0]
    assert by_id[1] == "777777"
    assert re.fullmatch("[0-9]{6}", by_id[2])


def test_a_repetition_penalty_beyond_float32_keeps_a_constrained_row_valid(model):
    """``repetition_penalty`` 1e-300 is a valid row (finite, > 0) that float32 casts to 0:
    the grammar-masked logits of tokens the row has seen must stay ``-inf`` (not NaN), so
    the row keeps to its regex instead of aborting with a parser error, and its neighbour
    in the batch gets what it gets alone."""
    import re

    from mlxpa.sampling_params import StructuredOutput

    tok = byte_tokenizer()
    digits = StructuredOutput.make("regex", "[0-9]{6}")
    ids = tok.encode("abc abc 123 xyz")
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=32), model, tok)
    other = EngineRequest("2", tok.encode("hello"), SamplingParams(max_tokens=6, temperature=1.0,
                                                               seed=3))
    outs = {int(o.request_id): o for o in eng.generate([
        EngineRequest("0", ids, SamplingParams(max_tokens=8, structured_outputs=digits,
                                           repetition_penalty=1e-300)),
        EngineRequest("1", ids, SamplingParams(max_tokens=8, structured_outputs=digits,
                                           repetition_penalty=1e300, temperature=1.0)),
        other])}
    for i in (0, 1):
        assert outs[i].error is None and re.fullmatch("[0-9]{6}", outs[i].text), outs[i]
    (alone,) = eng.generate([other])
    assert outs[2].token_ids == alone.token_ids
