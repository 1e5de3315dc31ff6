"""The model options as the caller spelled them, for the loader's one-line errors.

The same load serves the command line (``--model x``) and the Python API (``LLM(model='x')``);
an error should quote the caller's own spelling. The loader writes option names through
:func:`option`; the Python API loads inside :func:`python_spelling`, a context variable, so no
signature carries it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_PYTHON: ContextVar[bool] = ContextVar("mlxpa_python_spelling", default=False)


def option(name: str, value: Any = None) -> str:
    """``name`` (a keyword: ``model``, ``adapter_path``) as the caller spells it, with
    ``value`` when given.

    Returns:
        On the command line ``--adapter-path x`` (``--adapter-path`` without a value); inside
        :func:`python_spelling` ``adapter_path='x'`` (``adapter_path=``).
    """
    if _PYTHON.get():
        return f"{name}=" if value is None else f"{name}={str(value)!r}"
    flag = "--" + name.replace("_", "-")
    return flag if value is None else f"{flag} {value}"


def options(**values: Any) -> str:
    """Several options with their values (those not None), as :func:`option` spells them:
    ``--model x --revision r`` or ``model='x', revision='r'``."""
    sep = ", " if _PYTHON.get() else " "
    return sep.join(option(name, value) for name, value in values.items() if value is not None)


@contextmanager
def python_spelling() -> Iterator[None]:
    """Inside it, :func:`option` spells Python keywords (``model='x'``)."""
    token = _PYTHON.set(True)
    try:
        yield
    finally:
        _PYTHON.reset(token)
