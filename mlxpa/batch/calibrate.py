"""``mlxpa calibrate`` as a library call: labelled rows scored by the file run, a calibration
fitted per question (:mod:`mlxpa.annotation.calibration`).

    pass 1 (validate_input: every row and its gold labels checked) ─► the model loads
      ─► with content_free: the questions over contextual calibration's content-free
         documents (RequestStream, the same question requests as a row's)
      ─► run_file over the rows (their answers counted by an AnswerTally: each golded row's
         raw label log-probabilities and gold label, in input order)
      ─► calibrate(): one split (seed), per question a temperature (after the bias) fitted
         on the fitting rows, figures before and after on the held-out rows

The rows' answers are written to ``scores_output`` (or a temporary file), so a calibration
can be fitted again from them.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from rich.console import Console

from mlxpa.annotation.calibration import Calibration, calibrate
from mlxpa.annotation.questions import QuestionSet
from mlxpa.annotation.tally import AnswerTally
from mlxpa.annotation.temperature import CONTENT_FREE
from mlxpa.batch.model_meta import ModelMeta
from mlxpa.batch.options import OptionError, RunOptions
from mlxpa.batch.report import model_name
from mlxpa.batch.run import run_file
from mlxpa.batch.setup import build_engine
from mlxpa.batch.source import Source
from mlxpa.batch.validation import validate_input
from mlxpa.config import EngineConfig
from mlxpa.data import STDIN, InputOptions, Row
from mlxpa.engine import LLMEngine
from mlxpa.engine.metrics import Counters
from mlxpa.engine.stream import RequestStream
from mlxpa.inputs.processor import question_prompts
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class CalibrateOptions:
    """How :func:`calibrate_file` fits.

    Attributes:
        holdout: Share of the labelled rows held out for the figures.
        seed: The split's seed.
        content_free: Also fit contextual calibration's bias (Zhao et al. 2021).
        error_budget: The figures' error budget (the share accepted and its threshold).
        scores_output: Where the rows' answers go (None: a temporary file).
        show_progress: Progress bar and reports on the console.
    """

    holdout: float = 0.5
    seed: int = 0
    content_free: bool = False
    error_budget: float = 0.05
    scores_output: str | None = None
    show_progress: bool = True


class _Item(NamedTuple):
    request: EngineRequest


_NO_GOLD = ("{source}: no row has a gold label for a question of the set ({names}); give "
            "--gold-column or gold_field")


def calibrate_file(source: str, config: EngineConfig, inputs: InputOptions,
                   options: CalibrateOptions, console: Console | None = None) -> Calibration:
    """Score the labelled rows of ``source`` with ``inputs.questions`` and fit a calibration
    of every question that has gold labels.

    Raises:
        OptionError: No question set, or the input is stdin (it is read by two passes).
        InputError: The input cannot be read or has invalid rows (before the model loads).
        ValueError: No row has a gold label for any question of the set.
    """
    console = console or Console(stderr=True)
    questions = inputs.questions
    if questions is None:
        raise OptionError("calibrate needs --questions FILE")
    if source == STDIN:
        raise OptionError("calibrate reads its input twice; give a file, not -")
    with tempfile.TemporaryDirectory() as tmp:
        out = options.scores_output or os.path.join(tmp, "scores.jsonl")
        run = RunOptions(show_progress=options.show_progress,
                         name_output=options.scores_output is not None)
        meta = ModelMeta(config)
        with Source.open(source, inputs) as src:
            checked = validate_input(src, out, SamplingParams(), run, console,
                                     vocab_size=meta.vocab_size(),
                                     tokenizer=meta.tokenizer_or_none)
            chat = next((r.messages is not None for r in src.rows() if r.error is None), False)
            golded = any(r.gold and set(r.gold) & set(questions.names)
                         for r in src.rows() if r.error is None)
        if checked.validation.num_rows == 0:
            raise ValueError(f"{source}: no rows")
        if not golded:  # before the model loads
            raise ValueError(_NO_GOLD.format(source=source, names=", ".join(questions.names)))
        engine = build_engine(config, [], True, constrained=False, console=console,
                              verbose=options.show_progress, tokenizer=meta.tokenizer())
        cf = None
        if options.content_free:
            cf = content_free_scores(engine, questions, chat, inputs)
            if options.show_progress:
                console.print(f"scored the questions on {len(CONTENT_FREE)} content-free "
                              "documents (contextual calibration's bias)", markup=False,
                              highlight=False)
            engine.counters = Counters()  # the report counts the rows
        tally = AnswerTally(options.error_budget)
        run_file(source, out, config, SamplingParams(), run, inputs=inputs, console=console,
                 engine=engine, answers=tally, validated=checked)
    golded = {name: v for name, v in tally.golded().items()
              if name in questions.names and v[0].labels == questions[name].labels}
    if not golded:
        raise ValueError(_NO_GOLD.format(source=source, names=", ".join(questions.names)))
    return calibrate(QuestionSet(tuple(v[0] for v in golded.values()), questions.preamble),
                     {n: v[1] for n, v in golded.items()}, {n: v[2] for n, v in golded.items()},
                     content_free_logprobs=cf, seed=options.seed, holdout=options.holdout,
                     budget=options.error_budget, model=model_name(config.model))


def content_free_scores(engine: LLMEngine, questions: QuestionSet, chat: bool,
                        inputs: InputOptions) -> dict[str, np.ndarray]:
    """Each question's label log-probabilities ``[M, K]`` over the content-free documents
    (:data:`~mlxpa.annotation.temperature.CONTENT_FREE`), written as a row's document is: a
    text, or (``chat``) a user message.

    Raises:
        ValueError: A content-free document could not be scored (its error).
    """
    processor = ModelMeta(engine.config, engine).input_processor(inputs)
    items = []
    for i, doc in enumerate(CONTENT_FREE):
        row = Row(i, i, None if chat else doc, [{"role": "user", "content": doc}] if chat
                  else None, {}, questions=questions)
        items.append(_Item(processor.question_request(f"content-free/{i}",
                                                      *question_prompts(row))))
    scores: dict[str, list] = {q.name: [None] * len(items) for q in questions.questions}
    for item, (out,) in RequestStream(engine, "input").run([items]):
        if out.error is not None:
            raise ValueError(f"content-free document {item.request.request_id}: {out.error}")
        i = int(item.request.request_id.split("/")[1])
        for q, s in zip(questions.questions, out.question_scores):
            scores[q.name][i] = [s.logprobs[label] for label in q.labels]
    return {name: np.asarray(v, dtype=np.float64) for name, v in scores.items()}
