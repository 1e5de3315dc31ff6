"""A request's constraint and log-probability fields, in the names OpenAI and vLLM users
write (``docs/structured-outputs.md``): OpenAI's ``response_format``, vLLM's
``structured_outputs`` and its older ``guided_*`` fields (at most one, over the run's default
constraint), and OpenAI's ``logprobs`` / ``top_logprobs``, mapped onto vLLM's one
``SamplingParams.logprobs``. Each constraint is compiled here (cached by its canonical text),
so a bad schema, regex or grammar is a problem naming its field before any model work. No mlx.
"""

from __future__ import annotations

from typing import Any

from mlxpa.messages import field_error_text, quote_value
from mlxpa.sampling_params import (
    JSON_OBJECT,
    PARAMS_FIELDS,
    StructuredOutput,
    StructuredOutputsParams,
    sampling_field_problem,
)
from mlxpa.structured.spec import check

# vLLM's older per-kind constraint fields and the kind each gives.
GUIDED = {"guided_choice": "choice", "guided_regex": "regex", "guided_json": "json",
          "guided_grammar": "grammar"}
# Constraint and log-probability fields (parsed by :func:`parse_structured`).
STRUCTURED_FIELDS = ("response_format", "structured_outputs", *GUIDED, "logprobs",
                     "top_logprobs")
# Those whose CSV text is JSON.
JSON_TEXT_FIELDS = ("response_format", "structured_outputs", "guided_choice", "guided_json",
                    "logprobs", "top_logprobs")

__all__ = ["JSON_TEXT_FIELDS", "STRUCTURED_FIELDS", "cli_constraint", "parse_structured"]


def parse_structured(fields: dict, prefix: str, problems: list[str]) -> dict[str, Any]:
    """The ``structured_outputs`` and ``logprobs`` params of ``fields`` (a row or an OpenAI
    body); each problem is appended to ``problems`` naming ``prefix + field``."""
    params: dict[str, Any] = {}
    found = []
    for name in ("response_format", "structured_outputs", *GUIDED):
        value = fields.get(name)
        if value is None:
            continue
        try:
            so = _constraint(name, value, prefix + name)
        except ValueError as e:
            problems.append(field_error_text(prefix + name, str(e), value))
            continue
        if so is not None:
            error = check(so)
            if error is not None:
                problems.append(f'field "{prefix}{name}": {error}')
                continue
        found.append(name)
        params["structured_outputs"] = so
    if len(found) > 1:
        problems.append(f"give one constraint, not {' and '.join(prefix + f for f in found)}")
    params.update(_logprobs(fields, prefix, problems))
    return params


def _constraint(name: str, value: Any, source: str) -> StructuredOutput | None:
    if name in GUIDED:
        return StructuredOutput.make(GUIDED[name], value, source)
    if name == "structured_outputs":
        wanted = 'an object with one of "choice", "regex", "json", "grammar", "json_object"'
        if not isinstance(value, dict):
            raise ValueError(wanted)
        given = [k for k in PARAMS_FIELDS if value.get(k) is not None]
        if len(given) != 1 or value.get("json_object") is False:
            raise ValueError(wanted)
        if given[0] == "json_object":  # vLLM's object, converted as SamplingParams does
            return StructuredOutputsParams(json_object=value["json_object"]
                                           ).to_structured_output(source)
        return StructuredOutput.make(given[0], value[given[0]], source)
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json", JSON_OBJECT, source)
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or spec.get("schema") is None:
            raise ValueError('{"type": "json_schema", "json_schema": {"name", "schema"}}')
        return StructuredOutput.make("json", spec["schema"], source)
    raise ValueError('{"type": "text" | "json_object" | "json_schema", ...}')


def _logprobs(fields: dict, prefix: str, problems: list[str]) -> dict[str, Any]:
    """``{"logprobs": k}`` (or None: off) from OpenAI's ``logprobs`` (true/false, or an int
    in the completions API) and ``top_logprobs`` (it wins over the int); ``{}`` when the row
    asks nothing (``top_logprobs`` 0 alone)."""
    lp, top = fields.get("logprobs"), fields.get("top_logprobs")
    if lp is not None and not isinstance(lp, bool) and sampling_field_problem("logprobs", lp):
        problems.append(field_error_text(prefix + "logprobs",
                                         "true, false or an integer from 0 to 20", lp))
        lp = None
    if top is not None and sampling_field_problem("logprobs", top):
        problems.append(field_error_text(prefix + "top_logprobs",
                                         sampling_field_problem("logprobs", top), top))
        top = None
    if lp is False:
        return {"logprobs": None}
    count = top if top is not None else (0 if lp is True or lp is None else lp)
    return {} if lp is None and not count else {"logprobs": count}


def choice_labels(value: str) -> list[str]:
    """The labels of ``--choice A,B,..``: split at commas and kept verbatim, spaces included
    (a base model writes ``" positive"`` after ``"Sentiment:"``: ``--choice ' positive,
    negative'`` gives both labels a leading space).

    Raises:
        ValueError: An empty label (``a,,b``, a trailing comma) or a label given twice.
    """
    labels = value.split(",")
    for i, label in enumerate(labels):
        if not label:
            raise ValueError(f"--choice {value!r}: label {i + 1} is empty")
        if label in labels[:i]:
            raise ValueError(f"--choice {value!r}: label {label!r} is given twice")
    return labels


def cli_constraint(choice: str | None, json_schema: str | None, regex: str | None,
                   grammar: str | None) -> StructuredOutput | None:
    """The run's default constraint from ``--choice a,b,c``, ``--json-schema FILE``,
    ``--regex RE`` or ``--grammar FILE``.

    Raises:
        ValueError: More than one given, a file that cannot be read, or an invalid
            constraint (the message names the option and the file).
    """
    given = [(o, v) for o, v in (("--choice", choice), ("--json-schema", json_schema),
                                 ("--regex", regex), ("--grammar", grammar)) if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise ValueError(f"give one of {', '.join(o for o, _ in given)}")
    option, value = given[0]
    where = option
    if option in ("--json-schema", "--grammar"):
        where = f"{option} {value}"
        try:
            with open(value, encoding="utf-8") as f:
                value = f.read()
        except OSError as e:
            raise ValueError(f"{where}: {e.strerror or e}") from None
    if option == "--choice":
        value = choice_labels(value)
    kind = {"--choice": "choice", "--json-schema": "json", "--regex": "regex",
            "--grammar": "grammar"}[option]
    try:
        so = StructuredOutput.make(kind, value, option)
    except ValueError as e:
        raise ValueError(f"{where}: must be {e}, got {quote_value(value)}") from None
    error = check(so)
    if error is not None:
        raise ValueError(f"{where}: {error}")
    return so
