"""What ``LLM()`` shows while it loads the model: the loader's lines, in Python's spelling.

``mlxpa run`` prints the loader's INFO lines (``Loading the model ...``, an adapter applied,
a download or conversion, ``Loaded ... in 1.2 s``) through the logging it configures. ``LLM()``
shows the same few lines on stderr while it loads, as vLLM's ``LLM`` logs its start-up, and
nothing after; an application that configured logging itself (a root handler, or a level or
handler on the ``mlxpa`` logger) gets them its own way instead. Load errors name the options as
Python spells them (``model='x'``, not ``--model x``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from mlxpa.loader.spelling import python_spelling


@contextmanager
def loading_model() -> Iterator[None]:
    """Inside it: the ``mlxpa`` logger's INFO lines go to stderr (unless logging is
    configured), and load errors spell options as Python keywords."""
    with python_spelling(), _load_lines():
        yield


@contextmanager
def _load_lines() -> Iterator[None]:
    log = logging.getLogger("mlxpa")
    if log.level != logging.NOTSET or log.handlers or logging.getLogger().handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(logging.NOTSET)
