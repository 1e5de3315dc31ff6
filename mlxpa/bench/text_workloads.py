"""Benchmark prompts of real text, for speculative decoding and anything else that depends on
what the model writes: random-token prompts make a model loop, which overstates how often
a draft is accepted (the draft-free speculation study measured both).

Six few-shot completion prompts, as that study built them: each workload's instructions and
2–4 worked examples (the same for every row, as a real application's template), then the
row's own material, drawn from a seeded generator; the model answers up to a stop string or
EOS, within the workload's most output tokens (:data:`TEXT_WORKLOADS`):

- ``extraction``: an order e-mail (three phrasings) → one line of JSON with nine fields;
- ``summarise``: a paragraph of a Python standard-library docstring → a one-sentence summary;
- ``code-edit``: a stdlib function (5–16 lines) and "Rename the parameter ``x`` to ``new_x``"
  → the edited function;
- ``quote-qa``: a passage about a fictional town and a question → the answer and the sentence
  that supports it, quoted;
- ``labelling``: eight reviews (sentiment) or headlines (four topics) → numbered labels;
- ``continue``: the opening sentence of a story or an article, no instructions.

``copy-heavy`` interleaves ``code-edit``, ``quote-qa`` and ``summarise`` (the workloads whose
answers copy most from their prompts). The text is the same for a seed on every tokenizer
(the stdlib rows: on one Python version, :mod:`~mlxpa.bench.stdlib_text`); the prompts are
plain text for a base model, sent as one user message to a chat endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from mlxpa.bench import stdlib_text
from mlxpa.bench import text_tables as tt

SHOT_SEED = 20_240  # the generator of the worked examples (fixed: one template per workload)


class TextPrompt(NamedTuple):
    """One row of a text workload.

    Attributes:
        workload: The workload it belongs to.
        text: The whole prompt.
        material: The row's own input in it (the e-mail, paragraph, function, passage, list or
            opening sentence).
        reference: The answer the workload expects, where it defines one (the JSON, the
            edited function, the answer and quoted sentence, the labels); None otherwise.
        max_tokens: Most output tokens.
        stop: Stop strings (the row also ends at EOS).
    """

    workload: str
    text: str
    material: str
    reference: str | None
    max_tokens: int
    stop: tuple[str, ...]


class TextSpec(NamedTuple):
    """A workload: ``build(rng) -> (prompt, material, reference)``, its most output tokens
    and its stop strings (the study's)."""

    build: Callable[[np.random.Generator], tuple[str, str, str | None]]
    max_tokens: int
    stop: tuple[str, ...]


def _pick(rng: np.random.Generator, table):
    return table[int(rng.integers(len(table)))]


def _shots() -> np.random.Generator:
    return np.random.default_rng(SHOT_SEED)


# --- extraction ------------------------------------------------------------------------------

EXTRACTION_INTRO = ("Write each order as one line of JSON with the fields name, company, "
                    "email, phone, product, quantity, colour, town and deliver_by.\n\n")


def _order(rng: np.random.Generator) -> tuple[str, str]:
    """An order e-mail and its fields as one line of JSON."""
    first, last = _pick(rng, tt.FIRST_NAMES), _pick(rng, tt.LAST_NAMES)
    company, domain = _pick(rng, tt.COMPANIES)
    product = _pick(rng, tt.PRODUCTS)
    fields = {"name": f"{first} {last}", "company": company,
              "email": f"{first[0].lower()}.{last.lower()}@{domain}",
              "phone": f"{rng.integers(200, 999)} {rng.integers(1000, 9999)}",
              "product": product, "quantity": int(rng.integers(2, 60)),
              "colour": _pick(rng, tt.COLOURS), "town": _pick(rng, tt.TOWNS),
              "deliver_by": f"{rng.integers(1, 29)} {_pick(rng, tt.MONTHS)}"}
    mail = _pick(rng, tt.ORDER_MAILS).format(**fields, first=first, products=product + "s",
                                             ref=f"Q-{rng.integers(1000, 9999)}")
    return mail, json.dumps(fields)


def _extraction(rng: np.random.Generator) -> tuple[str, str, str | None]:
    shots = _shots()
    worked = "".join(f"E-mail:\n{m}\nJSON: {j}\n\n" for m, j in (_order(shots) for _ in range(2)))
    mail, fields = _order(rng)
    return f"{EXTRACTION_INTRO}{worked}E-mail:\n{mail}\nJSON:", mail, " " + fields


# --- summarise -------------------------------------------------------------------------------

SUMMARY_INTRO = "Summarise each paragraph in one sentence.\n\n"


def _summarise(rng: np.random.Generator) -> tuple[str, str, str | None]:
    worked = "".join(f"Paragraph: {p}\nSummary: {s}\n\n" for p, s in tt.SUMMARY_SHOTS)
    _, paragraph = _pick(rng, stdlib_text.docstring_paragraphs())
    return f"{SUMMARY_INTRO}{worked}Paragraph: {paragraph}\nSummary:", paragraph, None


# --- code-edit -------------------------------------------------------------------------------

CODE_INTRO = "Apply each edit to the function and write the whole edited function.\n\n"


def _edit(function: str, parameter: str) -> str:
    return (f"### Edit\nRename the parameter `{parameter}` to `new_{parameter}`.\n"
            f"### Function\n{function}### Edited function\n")


def _code_edit(rng: np.random.Generator) -> tuple[str, str, str | None]:
    worked = "".join(f"{_edit(f, p)}{stdlib_text.rename(f, p)}\n" for f, p in tt.CODE_SHOTS)
    fn = _pick(rng, stdlib_text.functions())
    return f"{CODE_INTRO}{worked}{_edit(fn.source, fn.parameter)}", fn.source, fn.renamed


# --- quote-qa --------------------------------------------------------------------------------

QA_INTRO = ("Answer each question from its passage, then quote the sentence of the passage that "
            "supports the answer.\n\n")
FACTS_PER_PASSAGE = 5


def _town(rng: np.random.Generator) -> tuple[str, str, str]:
    """A passage about a town (its first sentence, then facts in a drawn order), a question
    about one of the facts, and the answer quoting the fact's sentence."""
    town = _pick(rng, tt.TOWNS)
    values = dict(
        t=town, region=_pick(rng, tt.REGIONS), founded=int(rng.integers(1150, 1900)),
        founders=_pick(rng, tt.FOUNDERS), river=_pick(rng, tt.RIVERS),
        km=int(rng.integers(3, 80)), population=f"{int(rng.integers(2, 60)) * 500:,}",
        industry=_pick(rng, tt.INDUSTRIES), month=_pick(rng, tt.MONTHS),
        festival=_pick(rng, tt.FESTIVALS), landmark=_pick(rng, tt.LANDMARKS),
        built=int(rng.integers(1500, 1950)),
        mayor=f"{_pick(rng, tt.FIRST_NAMES)} {_pick(rng, tt.LAST_NAMES)}",
        elected=int(rng.integers(2010, 2025)), street=_pick(rng, tt.STREETS),
        weekday=_pick(rng, tt.WEEKDAYS), city=_pick(rng, tt.CITIES),
        minutes=int(rng.choice([10, 15, 20, 30, 40, 60])),
        twin=_pick(rng, [t for t in tt.TOWNS if t != town]),
        twinned=int(rng.integers(1960, 2015)))
    chosen = rng.choice(len(tt.TOWN_FACTS), FACTS_PER_PASSAGE, replace=False)
    facts = [[part.format(**values) for part in tt.TOWN_FACTS[int(i)]] for i in chosen]
    passage = " ".join([tt.TOWN_INTRO.format(**values), *(f[0] for f in facts)])
    sentence, question, answer = facts[int(rng.integers(len(facts)))]
    return passage, question, f'{answer}. Supporting sentence: "{sentence}"'


def _quote_qa(rng: np.random.Generator) -> tuple[str, str, str | None]:
    shots = _shots()
    worked = "".join(f"Passage: {p}\nQuestion: {q}\nAnswer: {a}\n\n"
                     for p, q, a in (_town(shots) for _ in range(2)))
    passage, question, answer = _town(rng)
    return (f"{QA_INTRO}{worked}Passage: {passage}\nQuestion: {question}\nAnswer:", passage,
            " " + answer)


# --- labelling -------------------------------------------------------------------------------

ITEMS_PER_ROW = 8


def _review(rng: np.random.Generator, label: str) -> str:
    return _pick(rng, tt.REVIEWS[label]).format(p=_pick(rng, tt.PRODUCTS))


def _headline(rng: np.random.Generator, label: str) -> str:
    return _pick(rng, tt.HEADLINES[label]).format(t=_pick(rng, tt.TOWNS),
                                                   c=_pick(rng, tt.COMPANIES)[0])


# kind -> (instruction, what a list is called, its labels, one item of a label)
LABEL_KINDS = {
    "reviews": ("Label each review as positive, negative or neutral.", "Reviews",
                tt.SENTIMENTS, _review),
    "headlines": ("Label each headline as sport, business, science or politics.", "Headlines",
                  tt.TOPICS, _headline),
}


def _numbered(lines) -> str:
    return "".join(f"\n{k}. {line}" for k, line in enumerate(lines, 1))


def _labelling(rng: np.random.Generator) -> tuple[str, str, str | None]:
    kind = _pick(rng, tuple(LABEL_KINDS))
    intro, title, labels, item = LABEL_KINDS[kind]
    shots = _shots()
    shown = (*labels, labels[1])[:4]  # every label in the four worked items
    worked = f"{title}:{_numbered(item(shots, g) for g in shown)}\nLabels:{_numbered(shown)}"
    gold = [_pick(rng, labels) for _ in range(ITEMS_PER_ROW)]
    items = _numbered(item(rng, g) for g in gold)
    return (f"{intro}\n\n{worked}\n\n{title}:{items}\nLabels:", items.lstrip("\n"),
            _numbered(gold))


# --- continue --------------------------------------------------------------------------------

def _continue(rng: np.random.Generator) -> tuple[str, str, str | None]:
    opening = _pick(rng, tt.OPENINGS).format(
        n=_pick(rng, tt.FIRST_NAMES), t=_pick(rng, tt.TOWNS), m=_pick(rng, tt.MONTHS),
        c=_pick(rng, tt.COMPANIES)[0], p=_pick(rng, tt.PRODUCTS) + "s")
    return opening, opening, None


# Every text workload by name: how a row is built, its most output tokens and stop strings.
TEXT_WORKLOADS: dict[str, TextSpec] = {
    "extraction": TextSpec(_extraction, 96, ("\n\n",)),
    "summarise": TextSpec(_summarise, 64, ("\n\n",)),
    "code-edit": TextSpec(_code_edit, 96, ("\n###",)),
    "quote-qa": TextSpec(_quote_qa, 64, ("\n\n",)),
    "labelling": TextSpec(_labelling, 64, ("\n\n",)),
    "continue": TextSpec(_continue, 96, ()),
}
# Mixes: their workloads' rows interleaved (row i from the (i mod n)-th workload).
MIXES = {"copy-heavy": ("code-edit", "quote-qa", "summarise")}
TEXT_NAMES = (*TEXT_WORKLOADS, *MIXES)


def text_prompts(name: str, num_prompts: int, seed: int = 0) -> list[TextPrompt]:
    """``num_prompts`` rows of the text workload or mix ``name`` (one of
    :data:`TEXT_NAMES`), the same for the same seed; a mix's rows of one workload are that
    workload's own first rows for the seed.

    Raises:
        ValueError: An unknown name or ``num_prompts`` < 1.
    """
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    if name in MIXES:
        parts = MIXES[name]
        rows = [text_prompts(p, -(-num_prompts // len(parts)), seed) for p in parts]
        return [rows[i % len(parts)][i // len(parts)] for i in range(num_prompts)]
    if name not in TEXT_WORKLOADS:
        raise ValueError(f"text workload must be one of {', '.join(TEXT_NAMES)}, got {name!r}")
    spec = TEXT_WORKLOADS[name]
    rng = np.random.default_rng([seed, list(TEXT_WORKLOADS).index(name)])
    return [TextPrompt(name, *spec.build(rng), spec.max_tokens, spec.stop)
            for _ in range(num_prompts)]


def text_params(name: str, num_prompts: int, seed: int) -> dict:
    """The parameters of a text workload for a report: its size and seed, and each of its
    workloads' most output tokens and stop strings."""
    parts = MIXES.get(name, (name,))
    return dict(num_prompts=num_prompts, seed=seed, workloads=list(parts),
                max_tokens={p: TEXT_WORKLOADS[p].max_tokens for p in parts},
                stop={p: list(TEXT_WORKLOADS[p].stop) for p in parts})
