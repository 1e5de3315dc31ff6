"""The ranges the server's OpenAPI models state (``protocol.py``, what ``/docs`` shows) are the
real checks': at each stated bound and just past it, the pydantic model and the rule a request
is checked by (:func:`mlxpa.sampling_params.sampling_field_problem`) accept and refuse the same
values, for every numeric field of both routes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mlxpa.entrypoints.openai import protocol
from mlxpa.sampling_params import REQUEST_FIELDS, sampling_field_problem

# Body fields whose rule is another field's (OpenAI's names for vLLM's).
RULE = {"max_completion_tokens": "max_tokens", "top_logprobs": "logprobs",
        "logprobs": "logprobs"}
ROUTES = {protocol.CompletionRequest: {"prompt": "x"},
          protocol.ChatCompletionRequest: {"messages": [{"role": "user", "content": "x"}]}}
LIMITS = {"minimum": (">=", -1), "exclusiveMinimum": (">", -1), "maximum": ("<=", 1),
          "exclusiveMaximum": ("<", 1)}


def stated_ranges(model) -> list[tuple[str, str, float, str, bool]]:
    """``(field, JSON type, bound, JSON Schema keyword, a map's values)`` for every numeric
    bound of ``model``'s properties."""
    out = []
    for name, prop in model.model_json_schema()["properties"].items():
        for option in prop.get("anyOf", [prop]):
            values = option.get("patternProperties", {})
            for schema, in_map in [(option, False), *((v, True) for v in values.values())]:
                for keyword in LIMITS:
                    if keyword in schema:
                        out.append((name, schema["type"], schema[keyword], keyword, in_map))
    return out


def _accepted_by_model(model, name: str, value, in_map: bool) -> bool:
    try:
        model.model_validate({**ROUTES[model], name: {"5": value} if in_map else value})
    except ValidationError:
        return False
    return True


def _accepted_by_rule(name: str, value, in_map: bool) -> bool:
    return sampling_field_problem(RULE.get(name, name), {5: value} if in_map else value) is None


@pytest.mark.parametrize("model", list(ROUTES), ids=lambda m: m.__name__)
def test_every_stated_range_is_the_rule_the_request_is_checked_by(model):
    ranges = stated_ranges(model)
    named = {name for name, *_ in ranges}
    assert {"temperature", "top_p", "n", "logit_bias", "presence_penalty"} <= named
    for name, kind, bound, keyword, in_map in ranges:
        step = 1 if kind == "integer" else 1e-6
        _, direction = LIMITS[keyword]
        inside = bound if keyword in ("minimum", "maximum") else bound - direction * step
        outside = bound + direction * step if keyword in ("minimum", "maximum") else bound
        for value, want in ((inside, True), (outside, False)):
            value = int(value) if kind == "integer" else float(value)
            assert _accepted_by_model(model, name, value, in_map) is want, (name, value)
            assert _accepted_by_rule(name, value, in_map) is want, (name, value)


def test_every_request_field_of_sampling_params_is_in_both_routes():
    for model in ROUTES:
        assert set(REQUEST_FIELDS) <= set(model.model_fields), model.__name__
