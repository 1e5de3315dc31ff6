"""Small helpers every floor may import (pure Python, no mlx, no other mlxpa module): integer
and number tests, JSON in and out (strict JSON lines, a JSON file)."""

from __future__ import annotations

import json
import math
from typing import Any


def cdiv(a, b):
    """Ceiling division ``-(-a // b)`` (ints or numpy arrays): blocks for ``a`` tokens of
    ``b`` per block."""
    return -(-a // b)


def is_int(x: object) -> bool:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_finite(x: object) -> bool:
    """True for a finite ``int`` or ``float`` that is not a ``bool``."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond float's range
        return False


def read_json(path: str):
    """The JSON value in the file ``path``.

    Raises:
        ValueError: The file cannot be read or is not JSON (the message names the file).
    """
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None


def json_default(value: Any) -> Any:
    """``json.dumps`` fallback that never fails (a result that cannot be written is lost):
    numpy values become lists or numbers, anything else its ``str``."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def json_line(record: dict) -> str:
    """``record`` as strict JSON (a kept input value of NaN or +-Infinity, which JSON cannot
    hold, is written as null)."""
    try:
        return json.dumps(record, ensure_ascii=False, default=json_default, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(record), ensure_ascii=False, default=json_default)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
