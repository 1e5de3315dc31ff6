"""Helpers of the CLI tests: invoke ``mlxpa``, write a JSONL input."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from mlxpa.cli import app

ROBOT = {"id": "bad", "messages": [{"role": "robot", "content": "hi"}]}  # a strict template's


def cli(*args, input=None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
