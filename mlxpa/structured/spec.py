"""A constraint's llguidance grammar, and the check that compiles it without a tokenizer.

The constraint itself (:class:`~mlxpa.sampling_params.StructuredOutput`: JSON schema, regex,
choice, grammar in canonical text) is a sampling parameter. :func:`check` compiles it with
llguidance's ``validate_grammar`` (schemas also go through ``jsonschema``'s meta-schema
check), so a bad constraint is a validation error before the model loads. No mlx here.
"""

from __future__ import annotations

import functools
import json

from mlxpa.sampling_params import StructuredOutput


def grammar_text(so: StructuredOutput) -> str:
    """The llguidance grammar (its JSON grammar format) for ``so``.

    Raises:
        ValueError: The grammar could not be converted (GBNF that does not parse, a schema
            llguidance does not accept), or ``so`` is a ``choice``, which is scored, not
            decoded.
    """
    from llguidance import LLMatcher, grammar_from

    if not so.decoded:
        raise ValueError("a choice is scored, not decoded under a grammar")
    if so.kind == "json":
        return LLMatcher.grammar_from_json_schema(so.spec)
    if so.kind == "regex":
        return LLMatcher.grammar_from_regex(so.spec)
    return grammar_from("grammar", so.spec)


@functools.lru_cache(maxsize=1024)
def check(so: StructuredOutput) -> str | None:
    """Why ``so`` cannot be used (compiled without a tokenizer), or None when it is valid
    (a ``choice`` compiles nothing: :meth:`StructuredOutput.make` checked its labels)."""
    if not so.decoded:
        return None
    if so.kind == "json":
        import jsonschema

        try:
            jsonschema.validators.validator_for(json.loads(so.spec)).check_schema(
                json.loads(so.spec))
        except jsonschema.SchemaError as e:
            return f"invalid JSON schema: {e.message}"
    try:
        from llguidance import LLMatcher

        error = LLMatcher.validate_grammar(grammar_text(so))
    except ValueError as e:
        error = str(e)
    if error and not error.startswith("WARNING"):
        detail = " ".join(line.strip() for line in error.strip().splitlines() if line.strip())
        return f"invalid {so.kind}: {detail[:300]}"
    return None
