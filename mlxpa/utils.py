"""Small helpers every floor may import (pure Python, no mlx, no other mlxpa module)."""

from __future__ import annotations

import json
import math


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
