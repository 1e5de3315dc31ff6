"""A model or adapter folder's JSON file (``config.json``, ``adapter_config.json``), read with
one error that names it."""

from __future__ import annotations

import json
from pathlib import Path


def read_json_object(where: Path) -> dict:
    """The JSON object in the file ``where``.

    Raises:
        ValueError: The file cannot be read or parsed (``{where}: not a JSON file (why)``) or
            holds something other than an object (``{where}: not a JSON object``).
    """
    try:
        value = json.loads(where.read_text())
    except (OSError, ValueError) as err:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"{where}: not a JSON file ({err})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: not a JSON object")
    return value
