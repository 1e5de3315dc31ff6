"""Typed questions over one document, answered with probabilities calibrated on labelled rows.

A row carries a document (``prompt`` or ``messages``) and is asked a question set (its own
``questions`` field, else the run's ``--questions FILE``)::

    {"preamble": "optional text before every document",
     "questions": [
       {"name": "topic", "type": "choice", "labels": ["sports", "politics"],
        "question": "What is the text about?"},
       {"name": "spam", "type": "yes_no", "question": "Is it spam?", "gold_field": "is_spam"},
       {"name": "quality", "type": "scale", "range": [1, 5], "question": "How well written?",
        "template": "\\n\\nRate the writing from 1 to 5.\\nRating: "}]}

Each question is scored as a choice row is, after the document and the question's suffix
(its template filled with ``{question}`` and ``{labels}``); one output row per input row
carries ``answers``: per question the label, ``probs`` over its labels (calibrated when a
calibration is given), the raw ``logprobs``, ``outside_prob`` and, for a scale, the
``expected`` value. A calibration (per question a temperature and optionally contextual
calibration's per-label bias) is fitted on labelled rows and written as a versioned JSON
file; quality figures (accuracy, macro-F1, log loss, Brier, ECE, kappa, the confusion
matrix, the share accepted at an error budget) compare answers with gold labels.

Modules, one concern each, pure Python with numpy (scipy to fit, matplotlib to draw; no mlx):

* :mod:`~mlxpa.annotation.questions`: :class:`Question`, :class:`QuestionSet`, parsing;
* :mod:`~mlxpa.annotation.render`: the text (or messages) a question is scored after;
* :mod:`~mlxpa.annotation.gold`: a row's questions and gold labels;
* :mod:`~mlxpa.annotation.answers`: one row's ``answers`` object;
* :mod:`~mlxpa.annotation.temperature`: the calibration map and its fits;
* :mod:`~mlxpa.annotation.calibration`: a question set's calibration, fitted on a split;
* :mod:`~mlxpa.annotation.calibration_file`: the calibration file;
* :mod:`~mlxpa.annotation.metrics`: the quality figures;
* :mod:`~mlxpa.annotation.report`: the tables, the metrics JSON, the reliability diagram;
* :mod:`~mlxpa.annotation.tally`: a run's answers counted: gold figures, the label order check.

The engine scores the questions (:mod:`mlxpa.engine.question_scores`: the document prefilled
once, each question forking it); the file run, ``mlxpa calibrate`` and ``LLM.annotate`` use
these modules around it.

``docs/annotation.md`` describes the formats in full. This file imports nothing.
"""
