"""``cache_salt`` in the request schema: read from a row, an OpenAI body and an HTTP body alike,
carried to the engine request by the one input processor (text, token ids, chat, questions);
anything but a string of 1 to 256 characters is the request's problem naming the field, and a
salt is never quoted back. A hypothesis test throws odd values at it (vLLM's
CVE-2026-105756: an unchecked salt killed the engine)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mlxpa.inputs import InputProcessor
from mlxpa.inputs.schema import ROW, RequestSpec, parse_request
from mlxpa.request import MAX_CACHE_SALT_CHARS, cache_salt_problem
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import byte_tokenizer

HTTP_CHAT = RequestSpec(body=True, api="chat", served=True)
HTTP_COMPLETIONS = RequestSpec(body=True, api="completions", served=True)
ANNOTATIONS = RequestSpec(body=True, api="annotations")
BATCH_BODY = RequestSpec(body=True, prefix="body.")
RULE = "must be a non-empty string of at most 256 characters"
CHAT = [{"role": "user", "content": "hi"}]
PROCESSOR = InputProcessor(byte_tokenizer(), 256, 512, chat_template=(
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"))


def test_every_envelope_reads_the_salt_into_the_engine_request():
    cases = [({"prompt": "abc"}, ROW), ({"prompt_token_ids": [5, 6, 7]}, ROW),
             ({"messages": CHAT}, ROW), ({"prompt": "abc"}, HTTP_COMPLETIONS),
             ({"prompt": [5, 6, 7]}, HTTP_COMPLETIONS), ({"messages": CHAT}, HTTP_CHAT),
             ({"prompt": "abc"}, BATCH_BODY)]
    processor = PROCESSOR
    for fields, spec in cases:
        for salt in ("tenant-1", "ü" * MAX_CACHE_SALT_CHARS, "a\x00b", " "):
            parsed = parse_request({**fields, "cache_salt": salt}, spec)
            assert parsed.problems == () and parsed.cache_salt == salt, (fields, spec)
            request = processor.process_inputs("r", parsed, SamplingParams())
            assert request.cache_salt == salt
        unsalted = parse_request({**fields, "cache_salt": None}, spec)  # null: absent
        assert unsalted.cache_salt is None and unsalted.problems == ()
        assert processor.process_inputs("r", unsalted, SamplingParams()).cache_salt is None


def test_a_question_group_carries_the_salt():
    qs = [{"name": "s", "type": "choice", "labels": ["pos", "neg"], "template": "\nS: "}]
    for spec in (ROW, ANNOTATIONS):
        parsed = parse_request({"prompt": "A fine day.", "questions": qs,
                                "cache_salt": "k"}, spec)
        assert parsed.problems == ()
        request = PROCESSOR.process_inputs("r", parsed, SamplingParams())
        assert request.questions and request.cache_salt == "k"


def test_a_bad_salt_is_the_requests_problem_naming_the_field():
    cases = [("", '""'), (5, "5"), (True, "true"), (["a"], '["a"]'), ({"k": 1}, '{"k": 1}'),
             (1.5, "1.5"), ("x" * 257, "a string of 257 characters")]
    for value, got in cases:
        for spec, name in ((ROW, "cache_salt"), (HTTP_CHAT, "cache_salt"),
                           (BATCH_BODY, "body.cache_salt")):
            fields = {"messages": CHAT, "cache_salt": value, "temperature": 0.5}
            parsed = parse_request(fields, spec)
            assert parsed.problems == (f'field "{name}" {RULE}, got {got}',), (value, spec)
            assert parsed.cache_salt is None and parsed.params == {"temperature": 0.5}
    # a lone surrogate (JSON's "\ud800") is not text: refused before any rule
    parsed = parse_request({"prompt": "x", "cache_salt": "a\ud800"})
    assert parsed.problems[0].startswith('field "cache_salt" is not Unicode text')


def test_a_long_salt_is_never_quoted_back():
    secret = "s3cr3t-" * 40  # 280 characters
    problem = cache_salt_problem(secret)
    assert problem.endswith("got a string of 280 characters") and "s3cr3t" not in problem


odd = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.binary(max_size=8)
    | st.text(max_size=300) | st.text(st.characters(codec="utf-8"), min_size=250,
                                      max_size=260)
    | st.text(st.sampled_from("\x00\u202e\ufeff\U0001f600a"), max_size=4)
    | st.just("x" * 100_000),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
    max_leaves=4)


@settings(max_examples=400, deadline=None)
@given(value=odd, spec=st.sampled_from([ROW, HTTP_CHAT, HTTP_COMPLETIONS, BATCH_BODY]))
def test_fuzz_odd_salts_are_a_problem_or_a_salt(value, spec):
    fields = {"prompt": "abc"} if spec is not HTTP_CHAT else {"messages": CHAT}
    parsed = parse_request({**fields, "cache_salt": value}, spec)  # never raises
    valid = isinstance(value, str) and 0 < len(value) <= MAX_CACHE_SALT_CHARS
    if value is None or valid:
        assert parsed.problems == () and parsed.cache_salt == value
        assert PROCESSOR.process_inputs("r", parsed, SamplingParams()).cache_salt == value
    else:
        (problem,) = parsed.problems
        assert problem.startswith(f'field "{spec.prefix}cache_salt" ') and len(problem) < 200
        assert parsed.cache_salt is None
