"""``mlxpa calibrate``: labelled rows scored with a question set, a calibration fitted per
question and written as a file for ``mlxpa run --calibration``."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from mlxpa.cli import options as opt
from mlxpa.cli.annotation import GoldColumnOpt, annotation_inputs

CALIBRATE_EXAMPLES = """\b
Examples:
  mlxpa calibrate gold.jsonl --questions q.json -o cal.json
  mlxpa calibrate gold.jsonl --questions q.json -o cal.json --content-free \\
      --holdout 0.5 --seed 1 --error-budget 0.05 --reliability-png cal.png
  mlxpa run new.jsonl -o out.jsonl --questions q.json --calibration cal.json
"""


def _fraction(value: float) -> float:
    if not 0 < value < 1:
        raise typer.BadParameter(f"must lie in (0, 1), got {value}")
    return value


def _budget(value: float) -> float:
    if not 0 <= value <= 1:
        raise typer.BadParameter(f"must lie in [0, 1], got {value}")
    return value


# Every engine option but the engine seed (scores are not sampled): --seed is the split's.
CALIBRATE_ENGINE = tuple(name for name in opt.ENGINE_FLAGS
                         if name != "seed" and name not in opt.POOL_FLAGS)


@opt.engine_options(*CALIBRATE_ENGINE)
def calibrate(
    input: Annotated[str, typer.Argument(
        help="Labelled rows (.jsonl, .csv, .parquet, a datasets folder): a document and gold "
        "labels.")],
    questions: Annotated[str, typer.Option(
        metavar="PATH", help="The question set (JSON, docs/annotation.md).")],
    output: Annotated[str, typer.Option("--output", "-o", help="The calibration file (JSON).")],
    engine: dict | None = None,  # the engine options (CALIBRATE_ENGINE) stand here
    gold_column: GoldColumnOpt = None,
    holdout: Annotated[float, typer.Option(
        callback=_fraction, help="Share of the labelled rows held out for the report.")] = 0.5,
    seed: Annotated[int, typer.Option(help="Seed of the fit/held-out split.")] = 0,
    content_free: Annotated[bool, typer.Option(
        "--content-free", help="Contextual calibration: also fit each question's per-label "
        "bias on content-free documents (N/A, empty, [MASK]); it can change answers.")] = False,
    error_budget: Annotated[float, typer.Option(
        callback=_budget, help="Error rate of the accepted answers the report sizes.")] = 0.05,
    reliability_png: Annotated[str | None, typer.Option(
        metavar="PATH", help="Save the reliability diagram (before/after) as PNG.")] = None,
    scores_output: Annotated[str | None, typer.Option(
        metavar="PATH", help="Also keep the rows' answers (JSONL or Parquet).")] = None,
    system: opt.SystemOpt = None,
    input_format: opt.InputFormatOpt = opt.InputFormat.auto,
    prompt_column: opt.PromptColumnOpt = "prompt",
    messages_column: opt.MessagesColumnOpt = "messages",
    id_column: opt.IdColumnOpt = "id",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    blas: opt.BlasOpt = "auto",
) -> None:
    """Score labelled rows with a question set, fit a calibration per question (a temperature;
    with --content-free also a per-label bias) on one split, print the held-out figures before
    and after (accuracy, macro-F1, log loss, Brier, ECE, the share accepted at the error
    budget and its threshold) and write the calibration file."""
    from rich.console import Console

    from mlxpa.annotation.calibration_file import save_calibration
    from mlxpa.annotation.report import calibration_tables, reliability_diagram
    from mlxpa.batch.calibrate import CalibrateOptions, calibrate_file
    from mlxpa.batch.options import OptionError, check_targets
    from mlxpa.data import InputError

    console = Console(stderr=True, soft_wrap=True)
    config = opt.checked_engine_config(engine)
    try:
        inputs = annotation_inputs(
            opt.input_options(input_format, prompt_column, messages_column, id_column, system),
            questions, gold_column, False)
        options = CalibrateOptions(holdout, seed, content_free, error_budget, scores_output,
                                   show_progress=not quiet)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if not quiet:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        from mlxpa.batch.options import RunOptions

        for target in (output, reliability_png):
            if target is not None:
                check_targets(input, target, RunOptions())
        cal = calibrate_file(input, config, inputs, options, console)
        for table in calibration_tables(cal):
            console.print(table)
        save_calibration(cal, output)
        console.print(f"wrote {output}", markup=False, highlight=False)
        if reliability_png is not None:
            reliability_diagram(reliability_png, {
                name: {"before": q.before, "after": q.after}
                for name, q in cal.questions.items()}, title=f"{input}: held-out rows")
            console.print(f"wrote {reliability_png}", markup=False, highlight=False)
    except OptionError as e:
        raise typer.BadParameter(str(e)) from None
    except InputError as e:
        opt.fail(console, e, 2)
    except (OSError, ValueError, ImportError) as e:
        opt.fail(console, e, 1)
