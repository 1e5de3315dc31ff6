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


# The fields of vLLM's ``StructuredOutputsParams`` that mlxpa runs, and the kind each gives.
PARAMS_FIELDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    """A constraint as vLLM spells it (``vllm.sampling_params.StructuredOutputsParams``):
    exactly one of the fields, given to ``SamplingParams(structured_outputs=...)``, which
    keeps it as its canonical :class:`StructuredOutput` (:meth:`to_structured_output`).

    Attributes:
        json: A JSON schema: a dict, or its JSON text.
        regex: A regular expression the whole completion matches (Rust ``regex`` syntax).
        choice: The completion is exactly one of these strings.
        grammar: A Lark grammar, or a GBNF grammar (converted by llguidance).
        json_object: True: any JSON object (the schema ``{"type": "object"}``).

    Raises:
        ValueError: None of the fields or more than one given, or a value of the wrong
            shape (naming the field). A schema, regex or grammar that does not compile is
            found by :func:`check`.
    """

    json: str | dict | bool | None = None
    regex: str | None = None
    choice: list[str] | tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        given = [k for k in PARAMS_FIELDS[:4] if getattr(self, k) is not None]
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise ValueError(f"structured_outputs.json_object must be true or false, got "
                             f"{self.json_object!r:.60}")
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError("structured_outputs must give one of json, regex, choice, "
                             f"grammar, json_object, got {', '.join(given) or 'none'}")
        self.to_structured_output()

    def to_structured_output(self, source: str | None = None) -> StructuredOutput:
        """The canonical constraint (what the engine keys its compiled grammars by;
        ``source``: where it was given, for messages).

        Raises:
            ValueError: The field's value has the wrong shape (naming the field).
        """
        if self.json_object:
            return StructuredOutput("json", JSON_OBJECT, source)
        kind = next(k for k in PARAMS_FIELDS[:4] if getattr(self, k) is not None)
        value = getattr(self, kind)
        try:
            return StructuredOutput.make(kind, list(value) if kind == "choice" and
                                         isinstance(value, tuple) else value, source)
        except ValueError as e:
            raise ValueError(f"structured_outputs.{kind} must be {e}, got "
                             f"{value!r:.60}") from None


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
