"""Per-request sampling parameters, vLLM's ``sampling_params.py``: :class:`SamplingParams` and
the structured-output parameters (:class:`StructuredOutputsParams` as vLLM spells a
constraint, :class:`StructuredOutput` its canonical form).

Every range rule is stated once, here: a row's sampling field is checked by building a
:class:`SamplingParams` from it (:func:`sampling_field_problem`). Compiling a constraint with
llguidance is :func:`mlxpa.structured.spec.check`'s job. No mlx.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass

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
        ignore_eos: Keep generating past the model's EOS ids (benchmarks).
        stop_token_ids: Token ids that end the completion like EOS (the token is kept in
            ``token_ids``, its text is not in ``text``); one id or a list of them.
        include_stop_str_in_output: Keep the matched stop string at the end of ``text``.
        min_tokens: Tokens to generate before EOS, stop token ids or stop strings may end
            the completion (EOS and stop token ids are masked out until then, as in vLLM).
        structured_outputs: Constraint on the completion: a :class:`StructuredOutputsParams`,
            kept as its canonical :class:`StructuredOutput`; None for free text.
        logprobs: None: no log-probabilities; ``k``: each generated token's log-probability
            and its ``k`` most likely alternatives (0 to :data:`MAX_LOGPROBS`), as vLLM's.
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
        output_kind: :class:`RequestOutputKind`: outputs when a sample finishes
            (``FINAL_ONLY``) or after every step (``DELTA``); not a row field.

    The order of the logit processing is vLLM v1's sampler's (``vllm/v1/sample/sampler.py``):
    raw log-probabilities (``logprobs``) first, then the grammar mask, ``min_tokens``,
    ``logit_bias``, the repetition, frequency and presence penalties, then temperature,
    top-k, top-p and min-p (greedy requests take the argmax of the penalised logits).

    Raises:
        FieldError: A field outside its range (naming it and what it wants).
        ValueError: A rule between two fields.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    structured_outputs: StructuredOutput | StructuredOutputsParams | None = None
    logprobs: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    prompt_logprobs: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY

    def __post_init__(self) -> None:
        self._normalize()
        self._check_fields()
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        self._check_between_fields()

    def _normalize(self) -> None:
        """vLLM's spellings to the stored ones: top_k -1, one stop string or token id, a
        list, a :class:`StructuredOutputsParams`."""
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)
        if self.top_k == -1:
            put("top_k", 0)
        if isinstance(self.stop_token_ids, list) or is_int(self.stop_token_ids):
            ids = self.stop_token_ids
            put("stop_token_ids", tuple(ids) if isinstance(ids, list) else (ids,))
        if isinstance(self.structured_outputs, StructuredOutputsParams):
            put("structured_outputs", self.structured_outputs.to_structured_output())
        if isinstance(self.stop, str):
            put("stop", (self.stop,))
        elif isinstance(self.stop, list):
            put("stop", tuple(self.stop))

    def _check_fields(self) -> None:
        """Each field's own range (:class:`FieldError`)."""
        def check(name: str, ok: bool, wanted: str) -> None:
            check_field(ok, name, getattr(self, name), wanted)
        check("max_tokens", is_int(self.max_tokens) and self.max_tokens >= 0, "an integer >= 0")
        check("temperature", is_finite(self.temperature) and self.temperature >= 0,
              "a finite number >= 0")
        check("top_p", is_finite(self.top_p) and 0 < self.top_p <= 1, "a number in (0, 1]")
        check("top_k", is_int(self.top_k) and self.top_k >= 0, "an integer >= 0 (or -1: off)")
        check("min_p", is_finite(self.min_p) and 0 <= self.min_p <= 1, "a number in [0, 1]")
        check("seed", self.seed is None or (is_int(self.seed) and self.seed >= 0),
              "an integer >= 0")
        check("stop", isinstance(self.stop, tuple)
              and all(isinstance(s, str) and s for s in self.stop),
              "a non-empty string or a list of them")
        check("n", is_int(self.n) and 1 <= self.n <= MAX_N, f"an integer from 1 to {MAX_N}")
        check("ignore_eos", isinstance(self.ignore_eos, bool), "true or false")
        check("stop_token_ids", isinstance(self.stop_token_ids, tuple)
              and all(is_int(t) and t >= 0 for t in self.stop_token_ids),
              "a token id (an integer >= 0) or a list of them")
        check("include_stop_str_in_output", isinstance(self.include_stop_str_in_output, bool),
              "true or false")
        check("min_tokens", is_int(self.min_tokens) and self.min_tokens >= 0, "an integer >= 0")
        check("structured_outputs", self.structured_outputs is None
              or isinstance(self.structured_outputs, StructuredOutput),
              "a StructuredOutputsParams or None")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            check(name, value is None or (is_int(value) and 0 <= value <= MAX_LOGPROBS),
                  f"an integer from 0 to {MAX_LOGPROBS}"
                  + (" or null" if name == "prompt_logprobs" else ""))
        check("output_kind", isinstance(self.output_kind, RequestOutputKind),
              "a RequestOutputKind")
        check("repetition_penalty", is_finite(self.repetition_penalty)
              and self.repetition_penalty > 0, "a finite number > 0 (1: off)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            check(name, is_finite(value) and -MAX_PENALTY <= value <= MAX_PENALTY,
                  f"a number from -{MAX_PENALTY:g} to {MAX_PENALTY:g} (0: off)")

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


_LOGIT_BIAS_WANTED = (f"an object of token id (an integer >= 0) -> bias from "
                      f"-{MAX_LOGIT_BIAS:g} to {MAX_LOGIT_BIAS:g}")


def _logit_bias(value: object) -> dict[int, float] | None:
    """``logit_bias`` as a new ``{int: float}`` dict (None when empty).

    Raises:
        FieldError: Not a mapping of integer ids >= 0 to finite biases in [-100, 100].
    """
    if value is None:
        return None
    ok = isinstance(value, Mapping) and all(
        is_int(k) and k >= 0 and is_finite(b) and -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS
        for k, b in value.items())
    check_field(ok, "logit_bias", value, _LOGIT_BIAS_WANTED)
    return {k: float(b) for k, b in value.items()} or None


def sampling_field_problem(name: str, value: object) -> str | None:
    """What :class:`SamplingParams` wants of field ``name`` when ``value`` breaks its rule
    (the ``wanted`` of :class:`FieldError`), else None. Rules between two fields
    (``min_tokens <= max_tokens``) are not checked: they hold once a row's fields are merged
    with the run's defaults."""
    try:
        SamplingParams(**{name: value})
    except FieldError as e:
        return e.wanted
    except ValueError:  # a rule between fields
        pass
    return None
