"""Seeds of unseeded sampled rows come from the run seed and the row's id: inserting an
unrelated row above them leaves their samples unchanged (tiny model, ``mlxpa run``)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mlxpa.cli import app
from tests.tiny_models import save_tiny_model

PROMPT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def run_rows(tmp_path, folder, name, rows) -> dict:
    src, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = CliRunner().invoke(app, ["run", str(src), "-o", str(out), "--model", folder,
                                 "--kv-memory", "0.01", "-q", "--temperature", "0.9",
                                 "--max-tokens", "8", "--seed", "5"])
    assert r.exit_code == 0, r.output
    got: dict = {}
    for line in out.read_text().splitlines():
        row = json.loads(line)
        got.setdefault(row["id"], []).append(row["text"])
    return got


def test_inserted_row_leaves_other_rows_samples_unchanged(tmp_path, folder):
    rows = [{"id": f"r{i}", "prompt": PROMPT} for i in range(4)]
    rows += [{"id": "two", "prompt": PROMPT, "n": 2}, {"id": "own", "prompt": PROMPT, "seed": 3}]
    before = run_rows(tmp_path, folder, "a", rows)
    after = run_rows(tmp_path, folder, "b", [{"id": "new", "prompt": PROMPT}, *rows])
    assert set(after) == set(before) | {"new"}
    assert {k: after[k] for k in before} == before
    # Identical prompts still sample differently (the seed depends on the id) ...
    assert len({before[f"r{i}"][0] for i in range(4)} | set(before["two"])) > 3
    # ... and the run seed still matters.
    src = tmp_path / "a.jsonl"
    r = CliRunner().invoke(app, ["run", str(src), "-o", str(tmp_path / "c.jsonl"), "--model",
                                 folder, "--kv-memory", "0.01", "-q", "--temperature", "0.9",
                                 "--max-tokens", "8", "--seed", "6"])
    assert r.exit_code == 0, r.output
    other = [json.loads(line)["text"] for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert other[:4] != [before[f"r{i}"][0] for i in range(4)]
