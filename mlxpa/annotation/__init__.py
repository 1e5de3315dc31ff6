"""Typed questions over a document (``choice``, ``yes_no``, ``scale``), answered with label
probabilities calibrated on labelled rows; pure Python with numpy (scipy to fit, matplotlib to
draw; no mlx). The engine scores the questions (:mod:`mlxpa.engine.question_scores`: the
document prefilled once); the file run, ``mlxpa calibrate``, ``LLM.annotate`` and the server
use these modules around it: ``questions`` (the set), ``render`` (the text a question is
scored after), ``gold``, ``answers``, ``temperature`` and ``calibration`` (the map and its
fit), ``calibration_file``, ``metrics``, ``report``, ``tally``. The formats:
``docs/annotation.md``. Imports nothing.
"""
