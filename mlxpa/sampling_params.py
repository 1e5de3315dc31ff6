"""Per-request sampling parameters, vLLM's ``sampling_params.py``: :class:`SamplingParams` and
the structured-output parameters (:class:`StructuredOutputsParams` as vLLM spells a
constraint, :class:`StructuredOutput` its canonical form).

Each field is stated once, here: its type, default, rule (:data:`_RULES`) and, for a field a
request may set, its ``mlxpa run`` option and OpenAPI range (its metadata), from which the
request schema (:mod:`mlxpa.inputs.schema`), the command line and the server's OpenAPI
models derive. No mlx.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mlxpa.messages import FieldError, check_field, surrogate_problem
from mlxpa.utils import is_finite, is_int

# Temperatures below this are greedy (vLLM's ``_SAMPLING_EPS``): ``1 / temperature`` would
# overflow float32 and turn the logits into infinities.
SAMPLING_EPS = 1e-5
# Most samples of one prompt: each is a request, so a row with n = 10**9 would stall the run
# (and hold its memory) instead of failing.
MAX_N = 1024
# Most alternatives per token of ``logprobs`` (vLLM's default ``max_logprobs``, OpenAI's limit).
MAX_LOGPROBS = 20
# Ranges of the OpenAI / vLLM penalty fields (OpenAI's API documents both).
MAX_PENALTY = 2.0  # presence_penalty and frequency_penalty lie in [-2, 2]
MAX_LOGIT_BIAS = 100.0  # a logit_bias value lies in [-100, 100]

# Constraint kinds (vLLM's names); a choice is scored, not decoded (engine/choice_scores).
KINDS = ("json", "regex", "choice", "grammar")
JSON_OBJECT = '{"type":"object"}'
# The fields of vLLM's ``StructuredOutputsParams`` that mlxpa runs.
PARAMS_FIELDS = ("json", "regex", "choice", "grammar", "json_object")


class RequestOutputKind(enum.IntEnum):
    """What the engine returns for a request (vLLM's ``RequestOutputKind``): ``FINAL_ONLY``,
    one output per sample when it finishes (the file run, ``LLM``); ``DELTA``, after every
    step the sample's new tokens, text and log-probabilities (a server's stream), the last
    one marked finished."""

    DELTA = 1
    FINAL_ONLY = 2


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """One request's constraint in canonical text: the key of the compiled grammar cache, so
    100,000 rows with one schema compile once.

    Attributes:
        kind: ``json`` (a JSON schema), ``regex`` (Rust ``regex`` syntax, matching the whole
            completion), ``choice`` (exactly one of a list of strings) or ``grammar`` (Lark,
            or GBNF converted by llguidance).
        spec: Canonical text: the schema as compact JSON (key order kept: llguidance
            generates properties in that order), the regex, the choices as a JSON list, or
            the grammar text.
        source: Where it was given, for messages: a row's field (``guided_choice``,
            ``body.structured_outputs``) or a CLI option (``--choice``); not part of the
            constraint's identity (equality, hash).
        choices: A ``choice`` constraint's labels, in order (read from ``spec`` once); None
            for the other kinds.
    """

    kind: str
    spec: str
    source: str | None = dataclasses.field(default=None, compare=False)
    choices: tuple[str, ...] | None = dataclasses.field(default=None, compare=False,
                                                       repr=False)

    def __post_init__(self) -> None:
        if self.kind == "choice" and self.choices is None:
            object.__setattr__(self, "choices", tuple(json.loads(self.spec)))

    @staticmethod
    def of_labels(labels: tuple[str, ...], source: str | None = None) -> StructuredOutput:
        """A ``choice`` constraint of labels already checked (a question's): the tuple kept
        as it is, its canonical text written once."""
        return StructuredOutput("choice", json.dumps(list(labels), ensure_ascii=False), source,
                                tuple(labels))

    @property
    def decoded(self) -> bool:
        """Whether a request with this constraint is decoded under a grammar: every kind but
        ``choice``, whose labels are scored."""
        return self.kind != "choice"

    @staticmethod
    def make(kind: str, value: object, source: str | None = None) -> StructuredOutput:
        """Build from a field's value: a schema as an object or JSON text, a regex or grammar
        as text, choices as a list of distinct strings.

        Raises:
            ValueError: ``value`` does not have the shape ``kind`` (one of :data:`KINDS`)
                needs (the message says what was wanted).
        """
        if kind == "json":
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError as e:
                    raise ValueError(f"a JSON schema (object or JSON text): {e}") from None
            if not isinstance(value, (dict, bool)):
                raise ValueError("a JSON schema (an object)")
            return StructuredOutput(kind, json.dumps(value, separators=(",", ":"),
                                                     ensure_ascii=False), source)
        if kind == "choice":
            wanted = "a non-empty list of distinct non-empty strings"
            if (not isinstance(value, list) or not value
                    or not all(isinstance(c, str) and c for c in value)):
                raise ValueError(wanted)
            if surrogate_problem(value) is not None:  # a tokenizer cannot encode the label
                raise ValueError(f"{wanted} of Unicode text (a label holds a lone surrogate)")
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
            found by :func:`mlxpa.structured.spec.check`.
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
        """The canonical constraint (``source``: where it was given, for messages).

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


def _request(default: Any, cli: str | None = None, *, decls: tuple[str, ...] = (),
             show_default: bool = True, **bounds: float) -> Any:
    """A field a request (a row, a body) may set by its name. ``cli``: the help of its
    ``mlxpa run`` option (None: no option; ``decls`` its names, default ``--<name>``);
    ``bounds``: its range as the OpenAPI schema states it (``ge``, ``gt``, ``le``)."""
    return dataclasses.field(default=default, metadata={
        "request": True, "cli": cli, "decls": decls, "show_default": show_default,
        "bounds": bounds})


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling and stopping parameters (vLLM's ``SamplingParams``: its names and
    shapes; the defaults are mlxpa's, greedy and 256 tokens, where vLLM's are temperature 1.0
    and 16 tokens).

    Attributes:
        max_tokens: Most tokens to generate (0 gives an empty completion, finish reason
            ``length``).
        temperature: 0 (or anything below :data:`SAMPLING_EPS`, as in vLLM) means greedy
            (argmax); above, samples from ``softmax(logits / temperature)``.
        top_p: Nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: Keep the k most likely tokens; 0 disables it (-1, vLLM's "off", is stored as 0).
        min_p: Drop tokens whose probability is below ``min_p * p_max``; 0 disables it.
        seed: Per-request seed; the same seed gives the same text whatever else is batched.
        stop: Stop strings; the completion ends before the earliest match (not included).
        n: Number of samples of the prompt (1 to :data:`MAX_N`).
        stop_token_ids: Token ids that end the completion like EOS (the token is kept in
            ``token_ids``, its text is not in ``text``); one id or a list of them.
        ignore_eos: Keep generating past the model's EOS ids (benchmarks).
        include_stop_str_in_output: Keep the matched stop string at the end of ``text``.
        min_tokens: Tokens to generate before EOS, stop token ids or stop strings may end
            the completion (EOS and stop token ids are masked out until then, as in vLLM).
        repetition_penalty: vLLM's (CTRL's, Keskar et al. 2019) multiplicative penalty, > 0
            (1: off): every token of the prompt or the output so far has its logit divided
            by it when positive, multiplied by it when not.
        presence_penalty: OpenAI's additive penalty in [-2, 2] (0: off), subtracted once
            from the logit of every token that occurs in the output so far (not the prompt).
        frequency_penalty: OpenAI's additive penalty in [-2, 2] (0: off), subtracted from a
            token's logit once per occurrence in the output so far (not the prompt).
        logit_bias: OpenAI's token id -> bias in [-100, 100], added to the token's logit
            before the penalties (None or empty: off); ids must index the vocabulary.
        prompt_logprobs: vLLM's: None (off), or the log-probability of every prompt token
            after the first with this many most likely alternatives (0 to 20); needs
            ``max_tokens >= 1`` and no ``choice`` constraint (a choice is scored).
        structured_outputs: Constraint on the completion: a :class:`StructuredOutputsParams`,
            kept as its canonical :class:`StructuredOutput`; None for free text.
        logprobs: None: no log-probabilities; ``k``: each generated token's log-probability
            and its ``k`` most likely alternatives (0 to :data:`MAX_LOGPROBS`), as vLLM's.
        output_kind: :class:`RequestOutputKind`: outputs when a sample finishes
            (``FINAL_ONLY``) or after every step (``DELTA``).

    The fields up to ``prompt_logprobs`` are request fields under their own names (their
    order is the order a request's problems are listed in); ``structured_outputs`` and
    ``logprobs`` are read from OpenAI's and vLLM's spellings (:mod:`mlxpa.structured.fields`).
    The order of the logit processing is vLLM v1's sampler's (``vllm/v1/sample/sampler.py``):
    raw log-probabilities (``logprobs``) first, then the grammar mask, ``min_tokens``,
    ``logit_bias``, the repetition, frequency and presence penalties, then temperature,
    top-k, top-p and min-p (greedy requests take the argmax of the penalised logits).

    Raises:
        FieldError: A field outside its range (naming it and what it wants).
        ValueError: A rule between two fields.
    """

    max_tokens: int = _request(256, "Default completion length cap (clamped to the context).",
                               ge=0)
    temperature: float = _request(0.0, "Default temperature; 0 = greedy.", ge=0)
    top_p: float = _request(1.0, "Default nucleus mass.", gt=0, le=1)
    top_k: int = _request(0, "Default top-k (0 or -1 = off).", ge=-1)
    min_p: float = _request(0.0, "Default min-p (0 = off).", ge=0, le=1)
    seed: int | None = _request(None, ge=0)  # --seed is the engine's (a row's derived seed)
    stop: tuple[str, ...] = _request(
        (), "Default stop string (repeatable; \\n \\t \\r \\\\ are escapes).")
    n: int = _request(1, "Default samples per prompt.", ge=1, le=MAX_N)
    stop_token_ids: tuple[int, ...] = _request((), "Default stop token id (repeatable).",
                                               decls=("--stop-token-id",))
    ignore_eos: bool = _request(False, "Default: generate past EOS up to max tokens.")
    include_stop_str_in_output: bool = _request(
        False, "Default: keep the matched stop string.", decls=("--include-stop-str",))
    min_tokens: int = _request(0, "Default tokens before EOS or a stop may end the text.", ge=0)
    repetition_penalty: float = _request(1.0, "Default repetition penalty (1 = off).",
                                         show_default=False, gt=0)
    presence_penalty: float = _request(0.0, "Default presence penalty, -2..2 (0 = off).",
                                       show_default=False, ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: float = _request(0.0, "Default frequency penalty, -2..2 (0 = off).",
                                        show_default=False, ge=-MAX_PENALTY, le=MAX_PENALTY)
    logit_bias: dict[int, float] | None = _request(None, ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)
    prompt_logprobs: int | None = _request(None, ge=0, le=MAX_LOGPROBS)
    structured_outputs: StructuredOutput | StructuredOutputsParams | None = None
    logprobs: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY

    def __post_init__(self) -> None:
        for name in _NORMALIZED:
            object.__setattr__(self, name, _normal(name, getattr(self, name)))
        for name, (ok, wanted) in _RULES.items():
            check_field(ok(getattr(self, name)), name, getattr(self, name), wanted)
        object.__setattr__(self, "logit_bias", _bias_floats(self.logit_bias))
        self._check_between_fields()

    def merged(self, overrides: Mapping[str, Any]) -> SamplingParams:
        """These parameters with a request's fields: the one merge of a request with its
        defaults (:meth:`mlxpa.inputs.InputProcessor.process_inputs`).

        Args:
            overrides: Field name to value. The fields of a :class:`CheckedFields` (what the
                request schema read) were each checked by their rule there and are not
                checked again; those of any other mapping are checked here.

        Raises:
            FieldError: A field of a plain mapping outside its range.
            ValueError: A rule between two fields (``min_tokens`` above ``max_tokens``).
        """
        if not isinstance(overrides, CheckedFields):
            for name, value in overrides.items():
                wanted = sampling_field_problem(name, value)
                if wanted is not None:
                    raise FieldError(name, wanted, _normal(name, value))
        new = copy.copy(self)
        for name, value in overrides.items():
            object.__setattr__(new, name, _normal(name, value))
        object.__setattr__(new, "logit_bias", _bias_floats(new.logit_bias))
        new._check_between_fields()
        return new

    def _check_between_fields(self) -> None:
        """The rules between two fields (a plain ``ValueError``)."""
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens ({self.max_tokens}), as in "
                             f"vLLM, got {self.min_tokens!r}")
        if self.prompt_logprobs is not None and self.structured_outputs is not None and (
                self.structured_outputs.kind == "choice"):
            raise ValueError("prompt_logprobs is not available on a choice row (it is scored, "
                             "not decoded: choice_logprobs gives each label's "
                             "log-probability)")
        if self.prompt_logprobs is not None and self.max_tokens == 0:
            raise ValueError("max_tokens must be >= 1 with prompt_logprobs (the prompt is "
                             "scored in the step that samples the first token, as in vLLM), "
                             "got 0")

    @property
    def greedy(self) -> bool:
        """True when sampling is an argmax (temperature below :data:`SAMPLING_EPS`)."""
        return self.temperature < SAMPLING_EPS

    @property
    def penalised(self) -> bool:
        """True when ``logit_bias`` or a penalty changes the logits."""
        return bool(self.logit_bias) or self.repetition_penalty != 1 or bool(
            self.presence_penalty) or bool(self.frequency_penalty)


class CheckedFields(dict):
    """A request's sampling fields as the request schema read them: each value kept by its
    field's rule (:func:`sampling_field_problem`), so :meth:`SamplingParams.merged` does not
    check it again."""

    __slots__ = ()


# The request fields, in order (those a row, a body or an ``LLM`` dict prompt may set by name).
REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams)
                       if f.metadata.get("request"))

_LOGIT_BIAS_WANTED = (f"an object of token id (an integer >= 0) -> bias from "
                      f"-{MAX_LOGIT_BIAS:g} to {MAX_LOGIT_BIAS:g}")
_BOOL = "true or false"


def _penalty(v: object) -> bool:
    return is_finite(v) and -MAX_PENALTY <= v <= MAX_PENALTY


def _logprob_count(v: object) -> bool:
    return v is None or (is_int(v) and 0 <= v <= MAX_LOGPROBS)


def _bias_ok(v: object) -> bool:
    return v is None or (isinstance(v, Mapping) and all(
        is_int(k) and k >= 0 and is_finite(b) and -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS
        for k, b in v.items()))


# Each field's own rule, stated once: (test of the stored value, what the field must be).
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_tokens": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
    "temperature": (lambda v: is_finite(v) and v >= 0, "a finite number >= 0"),
    "top_p": (lambda v: is_finite(v) and 0 < v <= 1, "a number in (0, 1]"),
    "top_k": (lambda v: is_int(v) and v >= 0, "an integer >= 0 (or -1: off)"),
    "min_p": (lambda v: is_finite(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "seed": (lambda v: v is None or (is_int(v) and v >= 0), "an integer >= 0"),
    "stop": (lambda v: isinstance(v, tuple) and all(isinstance(s, str) and s for s in v),
             "a non-empty string or a list of them"),
    "n": (lambda v: is_int(v) and 1 <= v <= MAX_N, f"an integer from 1 to {MAX_N}"),
    "stop_token_ids": (lambda v: isinstance(v, tuple) and all(is_int(t) and t >= 0 for t in v),
                       "a token id (an integer >= 0) or a list of them"),
    "ignore_eos": (lambda v: isinstance(v, bool), _BOOL),
    "include_stop_str_in_output": (lambda v: isinstance(v, bool), _BOOL),
    "min_tokens": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
    "repetition_penalty": (lambda v: is_finite(v) and v > 0, "a finite number > 0 (1: off)"),
    "presence_penalty": (_penalty, f"a number from -{MAX_PENALTY:g} to {MAX_PENALTY:g} (0: off)"),
    "frequency_penalty": (_penalty,
                          f"a number from -{MAX_PENALTY:g} to {MAX_PENALTY:g} (0: off)"),
    "logit_bias": (_bias_ok, _LOGIT_BIAS_WANTED),
    "prompt_logprobs": (_logprob_count, f"an integer from 0 to {MAX_LOGPROBS} or null"),
    "structured_outputs": (lambda v: v is None or isinstance(v, StructuredOutput),
                           "a StructuredOutputsParams or None"),
    "logprobs": (_logprob_count, f"an integer from 0 to {MAX_LOGPROBS}"),
    "output_kind": (lambda v: isinstance(v, RequestOutputKind), "a RequestOutputKind"),
}
_NORMALIZED = ("top_k", "stop", "stop_token_ids", "structured_outputs")


def _normal(name: str, value: Any) -> Any:
    """vLLM's spellings of a field to the stored ones: top_k -1, one stop string or token id,
    a list, a :class:`StructuredOutputsParams`; any other value unchanged."""
    if name == "top_k" and value == -1 and not isinstance(value, bool):
        return 0
    if name in ("stop", "stop_token_ids"):
        if isinstance(value, list):
            return tuple(value)
        if (isinstance(value, str) and name == "stop") or (
                is_int(value) and name == "stop_token_ids"):
            return (value,)
    if name == "structured_outputs" and isinstance(value, StructuredOutputsParams):
        return value.to_structured_output()
    return value


def _bias_floats(value: Mapping | None) -> dict[int, float] | None:
    """A checked ``logit_bias`` as a new ``{int: float}`` dict (None when empty)."""
    return None if value is None else {k: float(b) for k, b in value.items()} or None


def sampling_field_problem(name: str, value: object) -> str | None:
    """What :class:`SamplingParams` wants of field ``name`` when ``value`` breaks its rule
    (the ``wanted`` of :class:`FieldError`), else None: the field's rule applied to its
    stored spelling, once. Rules between two fields (``min_tokens <= max_tokens``) hold once
    a request's fields are merged with its defaults (:meth:`SamplingParams.merged`).

    Raises:
        TypeError: ``name`` is not a field of :class:`SamplingParams`.
    """
    rule = _RULES.get(name)
    if rule is None:
        raise TypeError(f"SamplingParams has no field {name!r}")
    ok, wanted = rule
    try:
        return None if ok(_normal(name, value)) else wanted
    except ValueError as e:  # a StructuredOutputsParams that does not convert
        return str(e)
