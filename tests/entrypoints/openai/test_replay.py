"""The server answers a recorded set of requests (``replay.jsonl``: completions and chat,
whole and streamed, log-probabilities, constraints, label probabilities and every kind of
refusal) exactly as the code it was recorded from did (:mod:`tests.entrypoints.openai.replay`):
the same status and the same bytes, response ids and times aside, floats to their last
digits."""

from __future__ import annotations

import json
import math
import re

from tests.entrypoints.openai.conftest import running_server
from tests.entrypoints.openai.replay import FIXTURE, ask

_FLOAT = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?|-?\d+[eE][-+]?\d+")


def same_bytes(got: str, want: str) -> bool:
    """Whether ``got`` is ``want`` byte for byte, except that each float may differ from its
    recorded value in float32's last bits (relative 1e-5: another BLAS sums in another order,
    and a prefix hit may read a copy of a cached block computed in another batch shape;
    relative 1e-7 is seen)."""
    if _FLOAT.sub("F", got) != _FLOAT.sub("F", want):
        return False
    return all(math.isclose(float(a), float(b), rel_tol=1e-5, abs_tol=1e-9)
               for a, b in zip(_FLOAT.findall(got), _FLOAT.findall(want)))


def test_same_bytes_sees_a_changed_byte_and_forgives_float_noise():
    want = '{"logprob": -1.2345678901234, "text": "a"}'
    assert same_bytes(want, want)
    assert same_bytes('{"logprob": -1.2345678901235, "text": "a"}', want)
    assert not same_bytes('{"logprob": -1.2346, "text": "a"}', want)
    assert not same_bytes('{"logprob": -1.2345678901234, "text": "b"}', want)
    assert not same_bytes('{"logprob":-1.2345678901234, "text": "a"}', want)


def test_the_recorded_requests_get_the_recorded_answers(folder):
    recorded = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    assert len(recorded) >= 70
    with running_server(folder) as server:  # fresh: the prefix cache starts empty
        answers = [ask(server.url, r["route"], r["body"]) for r in recorded]
    changed = [(i, r["body"], r["status"], a["status"], r["answer"][:300], a["answer"][:300])
               for i, (r, a) in enumerate(zip(recorded, answers))
               if r["status"] != a["status"] or not same_bytes(a["answer"], r["answer"])]
    assert not changed, "\n".join(map(str, changed))
