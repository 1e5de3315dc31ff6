"""Benchmark workloads: token-id prompts with a fixed output length each.

``random`` follows vLLM's random dataset (lengths uniform in ``[len * (1 - r), len * (1 + r)]``,
ids drawn from the vocabulary, kept only where they encode back to themselves:
:mod:`~mlxpa.bench.token_draw`), ``shared-prefix`` follows SGLang's generated-shared-prefix
dataset (groups sharing a system prompt, each prompt adding its own question), ``annotation``
labels synthetic product reviews with a ``choice`` constraint (a shared few-shot chat prefix,
as in ``examples/annotation.jsonl``), ``long-document`` gives each of a few long documents a
summary to write or, with ``questions``, typed questions to answer (the sliding-window KV
cache's case), and ``file`` takes any input ``mlxpa run`` accepts. The text workloads
(:mod:`~mlxpa.bench.text_workloads`: ``extraction``, ``summarise``, ``code-edit``,
``quote-qa``, ``labelling``, ``continue`` and the ``copy-heavy`` mix) are few-shot prompts of
real text whose rows end by themselves: at a stop string or EOS, within a most output length.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mlxpa.bench.text_workloads import TEXT_NAMES, text_params, text_prompts
from mlxpa.bench.token_draw import TokenDraw, token_draw
from mlxpa.request import QuestionPrompt
from mlxpa.sampling_params import StructuredOutput

LABELS = ("positive", "negative", "neutral")
_SHOTS = (("Awful, it stopped working on day two.", "negative"),
          ("Exactly what I needed, very happy.", "positive"), ("It is a phone case.", "neutral"))
_REVIEW_PARTS = (
    ("The", "This", "My new", "Our"),
    ("blender", "phone case", "desk lamp", "backpack", "kettle", "keyboard", "tent", "router"),
    ("works great", "broke after a week", "arrived on time", "is too loud", "looks lovely",
     "stopped charging", "is fine I guess", "smells odd", "exceeded my expectations"),
    ("and support was helpful.", "and nobody answered my emails.", "and the box was brown.",
     "so I returned it.", "so I bought another one.", "."),
)


class Workload(NamedTuple):
    """Prompts (token ids) and the number of tokens each generates: exactly that many (EOS
    ignored), unless the row can end by itself; with ``questions``, each prompt is a document
    and its typed questions (a question group: scored, nothing generated, its output length
    0).

    A row ends by itself, ``output_lens`` being its most tokens, when the workload is
    constrained (its grammar completes), has ``stop`` strings (the token whose text completes
    one ends it, as vLLM's ``stop``) or does not ``ignore_eos`` (an EOS token ends it, and is
    counted). Every system of :mod:`~mlxpa.bench.systems` ends rows the same way.
    """

    name: str
    prompts: list[list[int]]
    output_lens: list[int]
    params: dict
    structured: StructuredOutput | None = None
    questions: list[tuple[QuestionPrompt, ...]] | None = None
    stop: list[tuple[str, ...]] | None = None  # each row's stop strings
    ignore_eos: bool = True

    @property
    def num_prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    @property
    def num_output_tokens(self) -> int:
        """Output tokens asked for: exact, or the most when :attr:`exact_lengths` is False."""
        return sum(self.output_lens)

    @property
    def exact_lengths(self) -> bool:
        """Every row generates exactly its ``output_lens`` tokens."""
        return (self.ignore_eos and self.structured is None
                and not any(self.stop or ()))

    def head(self, n: int, max_tokens: int) -> Workload:
        """The first ``n`` rows, each generating at most ``max_tokens`` (a warm-up)."""
        cut = [min(max_tokens, m) for m in self.output_lens[:n]]
        return self._replace(prompts=self.prompts[:n], output_lens=cut,
                             questions=None if self.questions is None else self.questions[:n],
                             stop=None if self.stop is None else self.stop[:n])


def _draw(rng: np.random.Generator, draw: TokenDraw, n: int, bos: int | None,
          prefix: list[int] | None = None) -> list[int]:
    """``n`` ids that round-trip (:class:`~mlxpa.bench.token_draw.TokenDraw`): a prompt's
    start (the BOS first, when the tokenizer has one), or with ``prefix`` the ids that follow
    it (``prefix``: its ids without the BOS)."""
    if n <= 0:
        return []
    if prefix is None and bos is not None:
        return [bos] + (draw.draw(rng, n - 1) if n > 1 else [])
    return draw.draw(rng, n, prefix or [])


def random_workload(tokenizer, num_prompts: int = 128, input_len: int = 320,
                    output_len: int = 64, range_ratio: float = 0.6, seed: int = 0) -> Workload:
    """Random prompts with lengths uniform in ``input_len * [1 - range_ratio, 1 + range_ratio]``.

    Raises:
        ValueError: ``range_ratio`` outside [0, 1) or non-positive sizes.
    """
    if not 0 <= range_ratio < 1 or num_prompts < 1 or input_len < 1 or output_len < 1:
        raise ValueError("need num_prompts, input_len, output_len >= 1 and 0 <= range_ratio < 1")
    rng = np.random.default_rng(seed)
    draw = token_draw(tokenizer)
    lo, hi = max(1, int(input_len * (1 - range_ratio))), int(input_len * (1 + range_ratio))
    lens = rng.integers(lo, hi + 1, size=num_prompts)
    bos = getattr(tokenizer, "bos_token_id", None)
    prompts = [_draw(rng, draw, int(n), bos) for n in lens]
    return Workload("random", prompts, [output_len] * num_prompts,
                    dict(num_prompts=num_prompts, input_len=input_len, output_len=output_len,
                         range_ratio=range_ratio, seed=seed))


def shared_prefix_workload(tokenizer, num_groups: int = 8, prompts_per_group: int = 16,
                           system_prompt_len: int = 512, question_len: int = 64,
                           output_len: int = 32, seed: int = 0) -> Workload:
    """``num_groups`` system prompts, each shared by ``prompts_per_group`` questions.

    Prompts are listed group by group interleaved (row ``i`` belongs to group
    ``i % num_groups``), so sharing must be found, not read off the input order. Each system
    prompt, each question, and each system prompt followed by its question, encodes back to
    the same ids (:class:`~mlxpa.bench.token_draw.TokenDraw`)."""
    rng = np.random.default_rng(seed)
    draw = token_draw(tokenizer)
    bos = getattr(tokenizer, "bos_token_id", None)
    systems = [_draw(rng, draw, system_prompt_len, bos) for _ in range(num_groups)]
    prompts = []
    for i in range(num_groups * prompts_per_group):
        system = systems[i % num_groups]
        body = system[1:] if bos is not None and system[:1] == [bos] else system
        prompts.append(system + _draw(rng, draw, question_len, None, body))
    return Workload("shared-prefix", prompts, [output_len] * len(prompts),
                    dict(num_groups=num_groups, prompts_per_group=prompts_per_group,
                         system_prompt_len=system_prompt_len, question_len=question_len,
                         output_len=output_len, seed=seed))


def file_workload(tokenizer, path: str, output_len: int = 64,
                  vocab_size: int | None = None) -> Workload:
    """Every valid row of an input file ``mlxpa run`` accepts, checked and made into requests
    as ``run`` does (:func:`~mlxpa.batch.validation.validate_input`,
    :func:`~mlxpa.batch.requests.rows_to_requests`);
    a row that sets ``max_tokens`` generates that many tokens, the others ``output_len``.
    Invalid rows are left out: ``params["invalid_rows"]`` counts them, ``params["problems"]``
    names the first of them by file, line and field. Rows with ``max_tokens`` 0 generate
    nothing to time (and mlx-lm's generators refuse them): left out, counted in
    ``params["empty_rows"]``.

    Raises:
        InputError: The file is malformed, or has no valid row.
    """
    from mlxpa.batch.options import RunOptions
    from mlxpa.batch.requests import rows_to_requests
    from mlxpa.batch.source import Source
    from mlxpa.batch.validation import validate_input
    from mlxpa.data import InputError
    from mlxpa.inputs import InputProcessor
    from mlxpa.sampling_params import SamplingParams

    defaults = SamplingParams(max_tokens=output_len)
    with Source.open(path) as src:
        v = validate_input(src, None, defaults,
                           RunOptions(skip_invalid=True, show_progress=False),
                           vocab_size=vocab_size, tokenizer=lambda: tokenizer).validation
        processor = InputProcessor(tokenizer, split_special_tokens=src.inputs.split_special_tokens)
        requests = [rr.request for rr in rows_to_requests(src, v, defaults, processor)
                    if rr.request is not None]
    timed = [r for r in requests if r.sampling_params.max_tokens > 0]
    if not timed:
        raise InputError(v.report(what="nothing to time") if v.num_problems else
                         "every row has max_tokens 0: nothing to time" if requests else
                         "no rows", source=path)
    return Workload("file", [r.prompt_token_ids for r in timed],
                    [r.sampling_params.max_tokens for r in timed],
                    dict(path=path, output_len=output_len, invalid_rows=v.num_problems,
                         problems=v.problems, empty_rows=len(requests) - len(timed)))


def annotation_workload(tokenizer, num_prompts: int = 128, output_len: int = 4,
                        seed: int = 0) -> Workload:
    """Sentiment labelling: a shared few-shot chat prefix (three labelled reviews), then one
    synthetic review per row; the completion is constrained to one of :data:`LABELS`.

    Raises:
        ValueError: The tokenizer has no chat template.
    """
    from mlxpa.inputs import ChatPrompt, InputProcessor

    processor = InputProcessor(tokenizer)
    rng = np.random.default_rng(seed)
    prefix: list[dict] = []
    for k, (review, label) in enumerate(_SHOTS):
        intro = "Label the sentiment of each product review: positive, negative or neutral.\n\n"
        prefix += [{"role": "user", "content": (intro if k == 0 else "") + "Review: " + review},
                   {"role": "assistant", "content": label}]
    prompts = []
    for _ in range(num_prompts):
        words = [str(rng.choice(part)) for part in _REVIEW_PARTS]
        review = " ".join(words[:3]) + ("." if words[3] == "." else " " + words[3])
        messages = [*prefix, {"role": "user", "content": "Review: " + review}]
        prompts.append(processor.prompt_token_ids(ChatPrompt(messages)))
    return Workload("annotation", prompts, [output_len] * num_prompts,
                    dict(num_prompts=num_prompts, output_len=output_len, seed=seed,
                         choices=list(LABELS)),
                    StructuredOutput.make("choice", list(LABELS)))


# The typed questions of the long-document workload: a suffix after the document, its labels.
DOCUMENT_QUESTIONS = (
    ("\n\nQuestion: Is this document mostly about technology? Answer:", ("yes", "no")),
    ("\n\nQuestion: What is the tone of the document? Answer:",
     ("neutral", "positive", "negative")),
    ("\n\nQuestion: How long would a summary need to be? Answer:",
     ("one sentence", "one paragraph", "one page")),
    ("\n\nQuestion: Who is the document written for? Answer:",
     ("experts", "students", "the public", "children")),
    ("\n\nQuestion: Does the document contain a question? Answer:", ("yes", "no")),
)
SUMMARY = "\n\nSummarize the document above in one paragraph:"


def long_document_workload(tokenizer, num_prompts: int = 16, input_len: int = 8192,
                           output_len: int = 256, questions: int = 0,
                           seed: int = 0) -> Workload:
    """``num_prompts`` documents of ``input_len`` tokens (random ids that round-trip, as the
    other synthetic workloads draw them), each followed by an instruction to summarize it in
    ``output_len`` tokens or, with ``questions`` (1 to 5), asked that many typed questions
    (:data:`DOCUMENT_QUESTIONS`; a question group, its labels scored): the long-document use
    the sliding-window KV cache is for.

    Raises:
        ValueError: ``questions`` outside 0..5 or non-positive sizes.
    """
    if not 0 <= questions <= len(DOCUMENT_QUESTIONS) or min(num_prompts, input_len,
                                                             output_len) < 1:
        raise ValueError(f"need num_prompts, input_len, output_len >= 1 and 0 <= questions <= "
                         f"{len(DOCUMENT_QUESTIONS)}")
    rng = np.random.default_rng(seed)
    draw = token_draw(tokenizer)
    bos = getattr(tokenizer, "bos_token_id", None)
    docs = [_draw(rng, draw, input_len, bos) for _ in range(num_prompts)]
    params = dict(num_prompts=num_prompts, input_len=input_len, output_len=output_len,
                  questions=questions, seed=seed)
    if not questions:
        suffix = tokenizer.encode(SUMMARY, add_special_tokens=False)
        return Workload("long-document", [d + suffix for d in docs], [output_len] * len(docs),
                        params)
    asked = [(tokenizer.encode(q, add_special_tokens=False), labels)
             for q, labels in DOCUMENT_QUESTIONS[:questions]]
    groups = [tuple(QuestionPrompt(d + q, labels) for q, labels in asked) for d in docs]
    return Workload("long-document", docs, [0] * len(docs), params, questions=groups)


def text_workload(tokenizer, name: str, num_prompts: int = 24, seed: int = 0) -> Workload:
    """The text workload or mix ``name`` (:data:`~mlxpa.bench.text_workloads.TEXT_NAMES`):
    ``num_prompts`` rows tokenized as ``mlxpa run`` tokenizes a text prompt, each ending at
    its stop strings or EOS within its most output tokens.

    Raises:
        ValueError: An unknown name or ``num_prompts`` < 1.
    """
    from mlxpa.inputs import InputProcessor

    rows = text_prompts(name, num_prompts, seed)
    processor = InputProcessor(tokenizer)
    return Workload(name, [processor.prompt_token_ids(r.text) for r in rows],
                    [r.max_tokens for r in rows], text_params(name, num_prompts, seed),
                    stop=[r.stop for r in rows], ignore_eos=False)


WORKLOADS = ("random", "shared-prefix", "annotation", "long-document", "file", *TEXT_NAMES)


def make_workload(name: str, tokenizer, *, input: str | None = None, num_prompts: int = 128,
                  input_len: int = 320, range_ratio: float = 0.6, output_len: int = 64,
                  num_groups: int = 8, prompts_per_group: int = 16, system_prompt_len: int = 512,
                  question_len: int = 64, questions: int = 0, seed: int = 0,
                  vocab_size: int | None = None) -> Workload:
    """The workload ``name`` (one of :data:`WORKLOADS`) with the parameters that apply to it
    (``vocab_size``: the model's, for the token ids a ``file`` row gives; None: unchecked; a
    text workload takes ``num_prompts`` and ``seed``, its output lengths are its own).

    Raises:
        ValueError: An unknown name, or ``file`` without ``input``.
        InputError: The ``file`` input is malformed.
    """
    if questions and name != "long-document":
        raise ValueError("--questions applies to --workload long-document only")
    if name == "random":
        return random_workload(tokenizer, num_prompts, input_len, output_len, range_ratio, seed)
    if name == "shared-prefix":
        return shared_prefix_workload(tokenizer, num_groups, prompts_per_group,
                                      system_prompt_len, question_len, output_len, seed)
    if name == "annotation":
        return annotation_workload(tokenizer, num_prompts, min(output_len, 8), seed)
    if name == "long-document":
        return long_document_workload(tokenizer, num_prompts, input_len, output_len, questions,
                                      seed)
    if name == "file":
        if not input:
            raise ValueError("--workload file needs --input PATH")
        return file_workload(tokenizer, input, output_len, vocab_size)
    if name in TEXT_NAMES:
        return text_workload(tokenizer, name, num_prompts, seed)
    raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, got {name!r}")
