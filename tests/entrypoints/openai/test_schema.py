"""A property-based run of the server's own OpenAPI schema (schemathesis): request bodies
generated from it, valid and invalid, for every operation, against a live server on a tiny
model; none gets a 5xx (and every error is OpenAI's error object)."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests.entrypoints.openai.conftest import running_server

EXAMPLES = {"POST": 40, "GET": 5}


@pytest.mark.slow
def test_no_generated_request_gets_a_server_error(folder):
    # a short context and many sequences keep any generated request (n up to 1024) quick
    with running_server(folder, engine={"max_model_len": 64, "max_num_seqs": 64}) as s:
        schema = schemathesis.openapi.from_url(s.url + "/openapi.json")
        operations = [r.ok() for r in schema.get_all_operations()]
        assert {(o.method.upper(), o.path) for o in operations} >= {
            ("POST", "/v1/chat/completions"), ("POST", "/v1/completions")}
        for op in operations:
            post = op.method.upper() == "POST"  # a GET takes nothing that could be invalid
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)[:1 + post]:
                _run(op, mode, EXAMPLES[op.method.upper()])


def _run(op, mode, examples: int) -> None:
    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def check(case) -> None:
        response = case.call_and_validate(checks=[not_a_server_error], timeout=120)
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    check()
