"""What a constrained row asks for: one :class:`StructuredOutput` per row, in canonical text.

A constraint is one of four kinds (vLLM's ``structured_outputs`` names):

* ``json``: a JSON schema (``response_format`` ``json_schema``; ``json_object`` is the schema
  ``{"type": "object"}``);
* ``regex``: a regular expression the whole completion must match (Rust ``regex`` syntax);
* ``choice``: the completion is exactly one of a list of strings (its labels are scored, not
  decoded: :mod:`mlxpa.engine.choice_scores`);
* ``grammar``: a Lark grammar, or a GBNF grammar (converted by llguidance).

The canonical text (schemas as compact JSON, key order kept since properties are generated in
that order; choices as a JSON list) is the key of the compiled grammar cache, so 100,000 rows
with one schema compile once. :func:`check` compiles a
constraint without a tokenizer (llguidance's ``validate_grammar``; schemas also go through
``jsonschema``'s meta-schema check), so a bad constraint is a validation error before the
model loads. No mlx here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass

KINDS = ("json", "regex", "choice", "grammar")
JSON_OBJECT = '{"type":"object"}'


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """One row's constraint.

    Attributes:
        kind: ``json``, ``regex``, ``choice`` or ``grammar``.
        spec: Canonical text: the schema as compact JSON (key order kept), the regex, the
            choices as a JSON list, or the grammar text.
        source: Where it was given, for messages: a row's field (``guided_choice``,
            ``body.structured_outputs``) or a CLI option (``--choice``); not part of the
            constraint's identity (equality, hash).
    """

    kind: str
    spec: str
    source: str | None = dataclasses.field(default=None, compare=False)

    @property
    def choices(self) -> tuple[str, ...] | None:
        """The choices of a ``choice`` constraint, else None."""
        return tuple(json.loads(self.spec)) if self.kind == "choice" else None

    @property
    def decoded(self) -> bool:
        """Whether a row with this constraint is decoded under a grammar: every kind but
        ``choice``, whose labels are scored (:mod:`mlxpa.engine.choice_scores`)."""
        return self.kind != "choice"

    @staticmethod
    def make(kind: str, value: object, source: str | None = None) -> StructuredOutput:
        """Build from a field's value: a schema as an object or JSON text, a regex or grammar
        as text, choices as a list of distinct strings.

        Args:
            kind: One of :data:`KINDS`.
            value: The field's value.
            source: Where it was given (:attr:`source`).

        Raises:
            ValueError: ``value`` does not have the shape ``kind`` needs (the message says
                what was wanted).
        """
        if kind == "json":
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError as e:
                    raise ValueError(f"a JSON schema (object or JSON text): {e}") from None
            if not isinstance(value, (dict, bool)):
                raise ValueError("a JSON schema (an object)")
            # Key order kept: llguidance generates properties in the schema's order.
            return StructuredOutput(kind, json.dumps(value, separators=(",", ":"),
                                                     ensure_ascii=False), source)
        if kind == "choice":
            wanted = "a non-empty list of distinct non-empty strings"
            if (not isinstance(value, list) or not value
                    or not all(isinstance(c, str) and c for c in value)):
                raise ValueError(wanted)
            twice = next((c for i, c in enumerate(value) if c in value[:i]), None)
            if twice is not None:
                raise ValueError(f"{wanted} (label {json.dumps(twice, ensure_ascii=False)} "
                                 "is given twice)")
            return StructuredOutput(kind, json.dumps(list(value), ensure_ascii=False), source)
        if kind in ("regex", "grammar"):
            if not isinstance(value, str) or not value:
                raise ValueError(f"a non-empty {kind} string")
            return StructuredOutput(kind, value, source)
        raise ValueError(f"one of {', '.join(KINDS)}")


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
