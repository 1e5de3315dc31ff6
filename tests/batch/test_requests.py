"""``to_request`` (the one merge of a row's fields with the defaults, its prompt through the
input processor; its request id the row's id as text), ``over_context``, and pass 2's
``rows_to_requests`` and ``windows``, on the byte tokenizer of the tiny models (character ``c``
in 0x20..0x7e is id ``ord(c) - 28``; ``<eos>`` is 1), ids by hand."""

from __future__ import annotations

import json

from mlxpa.batch.requests import rows_to_requests, to_request
from mlxpa.batch.source import Source
from mlxpa.data import Row
from mlxpa.data.validate import validate
from mlxpa.engine.stream import windows
from mlxpa.inputs import InputProcessor, over_context
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import byte_tokenizer

TOK = byte_tokenizer()
PROC = InputProcessor(TOK)


def ids(text: str) -> list[int]:
    return [ord(c) - 28 for c in text]


def test_fields_merge_with_the_defaults_and_the_prompt_is_tokenized():
    row = Row(4, "r4", "hi", None, {"temperature": 0.5})
    req = to_request(row, SamplingParams(max_tokens=7), PROC)
    assert isinstance(req, EngineRequest)
    assert (req.request_id, req.prompt_token_ids) == ("r4", ids("hi"))
    assert (req.sampling_params.temperature, req.sampling_params.max_tokens) == (0.5, 7)
    assert to_request(Row(5, 5, "hi", None, {}), SamplingParams(), PROC).request_id == "5"


def test_split_special_tokens_makes_control_text_ordinary():
    row = Row(0, 0, "a<eos>b", None, {})
    plain = to_request(row, SamplingParams(), PROC)
    split = to_request(row, SamplingParams(), InputProcessor(TOK, split_special_tokens=True))
    assert plain.prompt_token_ids == [*ids("a"), 1, *ids("b")]
    assert split.prompt_token_ids == ids("a<eos>b")


def test_a_row_that_cannot_run_gets_why():
    conflict = Row(0, 0, "hi", None, {"min_tokens": 5})
    why = to_request(conflict, SamplingParams(max_tokens=2), PROC)
    assert isinstance(why, str) and "min_tokens" in why
    chat = Row(1, 1, None, [{"role": "user", "content": "hi"}], {})
    assert to_request(chat, SamplingParams(), PROC) == (
        'field "messages": this model has no chat template; give a text "prompt" (or a '
            'template: --chat-template)')
    long = Row(2, 2, "x" * 10, None, {})
    want = ("prompt has 10 tokens; the limit is 9 (the model context (--max-model-len) holds "
            "10 tokens)")
    assert over_context(10, 10) == want and over_context(9, 10) is None
    assert over_context(10, None) is None
    assert to_request(long, SamplingParams(), InputProcessor(TOK, max_model_len=10)) == want
    assert to_request(long, SamplingParams(), InputProcessor(TOK, max_model_len=11)).request_id


def test_rows_to_requests_skips_done_rows_places_errors_and_windows_count_every_row(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "prompt": "ab"}, {"id": "b", "prompt": ""}, {"id": "c", "prompt": "cd"},
        {"id": "d", "prompt": "long enough"}]))
    with Source.open(str(path)) as src:
        v = validate(src.rows(), source=src.name, unit=src.unit, defaults=SamplingParams())
        v.done["c"] = 2  # as if a resumed output held row c
        fed = list(rows_to_requests(src, v, SamplingParams(),
                                    InputProcessor(TOK, max_model_len=5)))
    assert [f.request.prompt_token_ids if f.request else None for f in fed] == [
        ids("ab"), None, None, None]
    assert [f.error for f in fed] == [
        None, f'{path} line 2: field "prompt" must be a non-empty string, got ""', None,
        f"{path} line 4: prompt has 11 tokens; the limit is 4 (the model context "
        "(--max-model-len) holds 5 tokens)"]
    assert [len(w) for w in windows(fed, 3)] == [3, 1]
    assert list(windows([], 3)) == []
