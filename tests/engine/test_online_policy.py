"""The scheduler's policy for requests that arrive while others decode (what ``mlxpa serve``
promises), on a tiny random llama, observed step by step through ``DELTA`` outputs:

* a long prompt that arrives is prefilled in chunks under ``max_num_batched_tokens``, and every
  running decode row gets its token in every one of those steps (never starved);
* with the chunks, a decode row's longest inter-token latency while the prompt arrives is a
  fraction of what one unchunked prefill step costs it;
* waiting requests are admitted in arrival order (first come, first served).
"""

from __future__ import annotations

import math
import time

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.sampling_params import RequestOutputKind, SamplingParams
from tests.tiny_models import byte_tokenizer, tiny_llama

TOK = byte_tokenizer(eos_id=-1)  # no EOS: requests run to max_tokens
DELTA = RequestOutputKind.DELTA
LONG_PROMPT = [3 + (i * 7) % 250 for i in range(1500)]


def _engine(budget: int, max_num_seqs: int = 8) -> LLMEngine:
    config = EngineConfig(block_size=16, num_blocks=400, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=budget)
    return LLMEngine(config, tiny_llama(hidden=128), TOK)


def _decoding_while_a_long_prompt_arrives(budget: int) -> tuple[list[int], int, list[float]]:
    """A row decoding, then the long prompt arriving: per step while the prompt prefills, how
    many tokens the decoding row got; the steps the prefill took; the row's gaps between
    tokens in those steps."""
    eng = _engine(budget)
    eng.add_request("decode", TOK.encode("a short prompt"),
                    SamplingParams(max_tokens=400, output_kind=DELTA))
    for _ in range(5):  # prefill and a few decodes
        eng.step()
    eng.add_request("long", LONG_PROMPT, SamplingParams(max_tokens=2, output_kind=DELTA))
    got, steps, times = [], 0, [time.perf_counter()]
    while True:
        outs = eng.step()
        times.append(time.perf_counter())
        steps += 1
        got.append(sum(len(o.token_ids) for o in outs if o.request_id == "decode"))
        if any(o.request_id == "long" for o in outs):  # its first token: prefill done
            break
    eng.abort_unfinished()
    return got, steps, [b - a for a, b in zip(times, times[1:])]


def test_a_long_prompt_is_chunked_and_decodes_get_a_token_every_step():
    got, steps, _ = _decoding_while_a_long_prompt_arrives(budget=128)
    # each step: one token for the decode row, the rest of the budget for the prompt
    assert steps == math.ceil(len(LONG_PROMPT) / 127)
    assert got == [1] * steps


def test_chunks_bound_the_decode_rows_inter_token_latency():
    chunked = max(_decoding_while_a_long_prompt_arrives(budget=128)[2])
    _, steps, gaps = _decoding_while_a_long_prompt_arrives(budget=4096)
    assert steps == 1  # one step computes the whole prompt and the decode row's token
    assert chunked < gaps[0] / 2


def test_waiting_requests_are_admitted_in_arrival_order():
    eng = _engine(budget=256, max_num_seqs=2)
    order = [f"r{i}" for i in range(7)]
    for i, rid in enumerate(order):  # prompts share no block: no waiting for a prefix
        eng.add_request(rid, TOK.encode(f"{i} " * 20), SamplingParams(
            max_tokens=3 + i % 3, output_kind=DELTA))
    first: list[str] = []
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.request_id not in first:
                first.append(o.request_id)
    assert first == order
