"""The atomic rewrite behind Parquet output and the JSONL ``--resume`` rewrite: the replaced file
keeps its mode, a new file gets ``0o666 & ~umask``, and a failure leaves the target untouched."""

from __future__ import annotations

import json
import os

import pytest

from mlxpa.data._files import atomic_rewrite
from mlxpa.data.resume import read_existing


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_new_file_gets_the_umask_mode(tmp_path):
    target = tmp_path / "new.bin"
    with atomic_rewrite(str(target)) as tmp:
        assert os.path.dirname(tmp) == str(tmp_path)
        assert os.path.basename(tmp).startswith(".new.bin.") and tmp.endswith(".tmp")
        with open(tmp, "wb") as f:
            f.write(b"x")
    assert target.read_bytes() == b"x"
    assert os.stat(target).st_mode & 0o777 == 0o666 & ~umask()
    assert os.listdir(tmp_path) == ["new.bin"]


def test_replaced_file_keeps_its_mode(tmp_path):
    target = tmp_path / "old.bin"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    with atomic_rewrite(str(target)) as tmp, open(tmp, "wb") as f:
        f.write(b"new")
    assert target.read_bytes() == b"new" and os.stat(target).st_mode & 0o777 == 0o640


def test_failure_leaves_the_target_and_no_temporary_file(tmp_path):
    target = tmp_path / "keep.bin"
    target.write_bytes(b"keep")
    with pytest.raises(RuntimeError), atomic_rewrite(str(target)) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"half")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"keep" and os.listdir(tmp_path) == ["keep.bin"]


def test_resume_rewrite_of_a_jsonl_output_keeps_its_mode(tmp_path):
    out = tmp_path / "o.jsonl"
    ok, err = {"id": 0, "text": "a"}, {"id": 1, "text": None, "error": "bad row"}
    out.write_text(json.dumps(ok) + "\n" + json.dumps(err) + "\n")
    os.chmod(out, 0o640)
    mode = os.stat(out).st_mode & 0o777
    e = read_existing(str(out), "jsonl")
    assert e.retried == 1 and out.read_text() == json.dumps(ok) + "\n"
    assert os.stat(out).st_mode & 0o777 == mode
