"""The calibration file (``mlxpa calibrate -o cal.json``, ``mlxpa run --calibration``): JSON,
versioned, one entry per question::

    {"format": "mlxpa-calibration", "version": 1, "model": str | null, "seed": int,
     "holdout": float, "error_budget": float, "content_free": [str] | null,
     "questions": {NAME: {"labels": [str], "temperature": float,
                          "bias": {label: float} | null, "num_fit": int, "num_heldout": int,
                          "before": {figures} | null, "after": {figures} | null}}}

``before`` and ``after`` are :func:`mlxpa.annotation.metrics.quality` of the held-out rows
(raw and calibrated). Reading checks every field and, given the question set it is applied
to, that each calibrated question exists with the same labels in the same order; every
problem names the file and the field.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from typing import Any

from mlxpa.annotation.calibration import FEW_ROWS, Calibration, QuestionCalibration, doubt
from mlxpa.annotation.questions import QuestionSet
from mlxpa.messages import field_error_text, quote_value
from mlxpa.utils import read_json

FORMAT = "mlxpa-calibration"
VERSION = 1


def calibration_dict(cal: Calibration) -> dict[str, Any]:
    """The file's JSON object of ``cal``."""
    return {"format": FORMAT, "version": VERSION, "model": cal.model, "seed": cal.seed,
            "holdout": cal.holdout, "error_budget": cal.error_budget,
            "content_free": None if cal.content_free is None else list(cal.content_free),
            "questions": {name: {"labels": list(q.labels), "temperature": q.temperature,
                                 "bias": None if q.bias is None else dict(zip(q.labels, q.bias)),
                                 "num_fit": q.num_fit, "num_heldout": q.num_heldout,
                                 "before": q.before, "after": q.after}
                          for name, q in cal.questions.items()}}


def save_calibration(cal: Calibration, path: str | os.PathLike) -> None:
    """Write ``cal`` as the calibration file at ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(calibration_dict(cal), f, indent=2, ensure_ascii=False)
        f.write("\n")


def load_calibration(path: str | os.PathLike,
                     questions: QuestionSet | None = None) -> Calibration:
    """Read a calibration file; with ``questions``, check it against them and keep only
    their calibrations. A question's calibration fitted on few rows or with its temperature at
    an end of its range is loaded with a warning (:func:`~mlxpa.annotation.calibration.doubt`).

    Raises:
        ValueError: The file cannot be read, is not a calibration file of this version, or a
            field is wrong, or a calibrated question is not one of ``questions`` with the
            same labels (the message names the file and the fields).
    """
    obj = read_json(path)
    problems: list[str] = []
    cal = parse_calibration(obj, problems, questions)
    if cal is None:
        raise ValueError(f"{path}: {'; '.join(problems)}")
    for name, q in cal.questions.items():
        why = doubt(q)
        if why is not None:  # its probabilities would be taken for certainties
            warnings.warn(f"{path}: question {name!r} was {why}: its calibrated probs are "
                          f"not to be trusted (refit on {FEW_ROWS}+ labelled rows, some "
                          "answered wrong)", stacklevel=2)
    return cal


def parse_calibration(obj: Any, problems: list[str],
                      questions: QuestionSet | None = None) -> Calibration | None:
    """A :class:`Calibration` from the file's JSON object; None with ``problems`` appended."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        problems.append(f'not a calibration file (no "format": "{FORMAT}")')
        return None
    if obj.get("version") != VERSION:
        problems.append(field_error_text("version", f"{VERSION} (this mlxpa's calibration format)",
                            obj.get("version")))
        return None
    entries = obj.get("questions")
    if not isinstance(entries, dict):
        problems.append(field_error_text("questions", "an object of question names", entries))
        return None
    before = len(problems)
    fitted = {}
    for name, entry in entries.items():
        if questions is not None and name not in questions.names:
            continue
        q = _question(entry, f"questions.{name}", problems)
        if q is not None and questions is not None and q.labels != questions[name].labels:
            wanted = quote_value(list(questions[name].labels))
            problems.append(f'field "questions.{name}.labels" {quote_value(list(q.labels))} are '
                            f"not question {quote_value(name)}'s labels {wanted}")
        fitted[name] = q
    settings = _settings(obj, problems)
    if len(problems) > before or settings is None:
        return None
    return Calibration(fitted, *settings)


def _settings(obj: dict, problems: list[str]) -> tuple | None:
    """``(seed, holdout, error_budget, content_free, model)`` of the file."""
    seed, holdout = obj.get("seed", 0), obj.get("holdout", 0.5)
    budget, cf, model = obj.get("error_budget", 0.05), obj.get("content_free"), obj.get("model")
    before = len(problems)
    if not (isinstance(seed, int) and not isinstance(seed, bool)):
        problems.append(field_error_text("seed", "an integer", seed))
    for name, value in (("holdout", holdout), ("error_budget", budget)):
        if not (_number(value) and 0 <= value <= 1):
            problems.append(field_error_text(name, "a number in [0, 1]", value))
    if cf is not None and not (isinstance(cf, list) and all(isinstance(d, str) for d in cf)):
        problems.append(field_error_text("content_free", "a list of strings or null", cf))
    if model is not None and not isinstance(model, str):
        problems.append(field_error_text("model", "a string or null", model))
    if len(problems) > before:
        return None
    return seed, float(holdout), float(budget), None if cf is None else tuple(cf), model


def _question(entry: Any, field: str, problems: list[str]) -> QuestionCalibration | None:
    if not isinstance(entry, dict):
        problems.append(field_error_text(field, 'an object with "labels" and "temperature"', entry))
        return None
    labels, t, bias = entry.get("labels"), entry.get("temperature"), entry.get("bias")
    before = len(problems)
    if not (isinstance(labels, list) and len(labels) >= 2
            and all(isinstance(c, str) and c for c in labels) and len(set(labels)) == len(labels)):
        problems.append(field_error_text(f"{field}.labels",
                                         "a list of 2 or more distinct labels", labels))
        return None
    if not (_number(t) and t > 0):
        problems.append(field_error_text(f"{field}.temperature", "a number > 0", t))
    if bias is not None and not (isinstance(bias, dict) and set(bias) == set(labels)
                                 and all(_number(v) for v in bias.values())):
        problems.append(field_error_text(f"{field}.bias", "null or a number for each label", bias))
    counts = [entry.get("num_fit", 0), entry.get("num_heldout", 0)]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        problems.append(field_error_text(f"{field}.num_fit",
                                         "integers >= 0 (num_fit, num_heldout)", counts))
    figures = [entry.get("before"), entry.get("after")]
    if not all(f is None or isinstance(f, dict) for f in figures):
        problems.append(field_error_text(f"{field}.before",
                                         "objects or null (before, after)", figures))
    if len(problems) > before:
        return None
    return QuestionCalibration(tuple(labels), float(t),
                               None if bias is None else tuple(float(bias[c]) for c in labels),
                               counts[0], counts[1], *figures)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
