"""The annotation options of ``mlxpa run`` and ``mlxpa calibrate`` (questions over each row's
document, gold labels, a calibration, the label order check) and their reading, before any
input is read (a bad file is a usage error naming it and the field)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated

import typer

from mlxpa.cli.options import text_option
from mlxpa.data.reader_options import InputOptions

if TYPE_CHECKING:
    from mlxpa.annotation.calibration import Calibration

# One line each in --help (docs/annotation.md says the rest).
QuestionsOpt = text_option("PATH", "Questions for each row (docs/annotation.md).")
GoldColumnOpt = text_option("NAME", "Gold labels' field (figures in the report).")
CalibrationOpt = text_option("PATH", "Calibrate the answers with this file.")
PermuteLabelsOpt = Annotated[bool, typer.Option(
    "--permute-labels", help="Also score questions with labels reversed.")]


def annotation_inputs(inputs: InputOptions, questions: str | None, gold_column: str | None,
                      permute_labels: bool) -> InputOptions:
    """``inputs`` with the question set of ``questions`` (a file), the gold column and the
    label order check.

    Raises:
        ValueError: The questions file cannot be read or is not a question set (naming the
            file and the field).
    """
    from mlxpa.annotation.questions import load_questions

    qs = load_questions(questions) if questions is not None else None
    return dataclasses.replace(inputs, questions=qs, gold_column=gold_column or None,
                               permute_labels=permute_labels)


def read_calibration(path: str | None, inputs: InputOptions) -> Calibration | None:
    """The calibration file at ``path`` (None: none), checked against the run's questions.

    Raises:
        ValueError: As :func:`mlxpa.annotation.calibration_file.load_calibration`.
    """
    if path is None:
        return None
    from mlxpa.annotation.calibration_file import load_calibration

    return load_calibration(path, inputs.questions)


def check_annotation(inputs: InputOptions, calibration: str | None, *, ray: bool,
                     constrained: bool, output_format: str) -> None:
    """Refuse combinations that cannot run.

    Raises:
        ValueError: ``--questions`` with a default constraint or ``--output-format openai``;
            an annotation option with ``--ray``.
    """
    if inputs.questions is not None and constrained:
        raise ValueError("--questions scores labels itself; give it without --choice, "
                         "--json-schema, --regex or --grammar")
    if inputs.questions is not None and output_format == "openai":
        raise ValueError("--questions writes mlxpa rows with \"answers\"; use --output-format "
                         "mlxpa or auto")
    given = [flag for flag, on in (("--questions", inputs.questions is not None),
                                   ("--gold-column", inputs.gold_column is not None),
                                   ("--calibration", calibration is not None),
                                   ("--permute-labels", inputs.permute_labels)) if on]
    if ray and given:
        raise ValueError(f"{given[0]} runs locally; give it without --ray")
