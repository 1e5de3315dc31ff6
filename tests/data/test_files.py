"""The atomic rewrite behind Parquet output and the JSONL ``--resume`` rewrite: the replaced file
keeps its mode, a new file gets ``0o666 & ~umask``, and a failure leaves the target untouched."""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from mlxpa.data._files import atomic_rewrite, check_output_path
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


# --- check_output_path: an output that cannot be written fails before any work ----------


def _check_error(target) -> str:
    with pytest.raises(ValueError) as info:
        check_output_path(str(target))
    return str(info.value)


def test_a_folder_in_place_of_the_file(tmp_path):
    assert _check_error(tmp_path) == f"{tmp_path} is a folder; give a file path"


def test_a_missing_folder(tmp_path):
    target = tmp_path / "missing" / "out.jsonl"
    assert _check_error(target) == (f"{target}: the output folder {tmp_path / 'missing'} "
                                    "does not exist")


def test_a_file_in_place_of_the_folder(tmp_path):
    """Root cannot write under a regular file either."""
    (tmp_path / "notes.txt").write_text("x")
    target = tmp_path / "notes.txt" / "out.jsonl"
    assert _check_error(target) == f"{target}: {tmp_path / 'notes.txt'} is not a folder"
    assert (tmp_path / "notes.txt").read_text() == "x"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_dev_full_is_refused_and_dev_null_accepted():
    """/dev/full refuses every write (even of zero bytes) with ENOSPC, for root too."""
    assert _check_error("/dev/full") == "/dev/full: cannot be written (No space left on device)"
    check_output_path("/dev/null")


def test_an_existing_file_is_left_as_it_was(tmp_path):
    target = tmp_path / "out.jsonl"
    target.write_text('{"id": 1}\n')
    os.utime(target, ns=(1_000_000_000, 2_000_000_000))
    check_output_path(str(target))
    assert target.read_text() == '{"id": 1}\n'
    assert target.stat().st_mtime_ns == 2_000_000_000
    assert os.listdir(tmp_path) == ["out.jsonl"]  # the probe file is gone


FILES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "mlxpa", "data", "_files.py")
# mlxpa/data/_files.py needs only the standard library: loaded by path, it runs in a bare
# system Python, which another user can execute (the venv's interpreter may sit under /root).
CHECK = ("import importlib.util, sys\n"
         "spec = importlib.util.spec_from_file_location('files', sys.argv[1])\n"
         "files = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(files)\n"
         "try:\n    files.check_output_path(sys.argv[2])\n"
         "except ValueError as e:\n    print(e)\nelse:\n    print('ok')\n")


def _check_in_child(target: str, as_nobody: bool = False, prefix: tuple[str, ...] = ()):
    """``check_output_path(target)`` in a fresh system Python, as uid/gid 65534 when
    ``as_nobody`` (root passes permission bits, so only another user shows what they
    refuse), after the command ``prefix`` (a mount namespace)."""
    import shutil
    import subprocess

    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 for the child process")

    def drop():
        os.setgid(65534)
        os.setuid(65534)

    return subprocess.run([*prefix, python, "-I", "-c", CHECK, FILES, target],
                          capture_output=True, text=True, timeout=60,
                          preexec_fn=drop if as_nobody else None)


@pytest.fixture
def shared_dir():
    """A folder under /tmp that uid 65534 can reach (pytest's tmp_path is root's, 0700)."""
    import shutil

    folder = tempfile.mkdtemp(prefix="mlxpa-ro-", dir="/tmp")
    yield folder
    os.chmod(folder, 0o755)
    shutil.rmtree(folder)


def test_a_read_only_folder(shared_dir):
    os.chmod(shared_dir, 0o555)
    target = os.path.join(shared_dir, "out.jsonl")
    want = f"{target}: cannot write a file in {shared_dir} (Permission denied)"
    if os.geteuid() != 0:
        assert _check_error(target) == want
        return
    check_output_path(target)  # root may write there: no error, and nothing left behind
    assert os.listdir(shared_dir) == []
    r = _check_in_child(target, as_nobody=True)
    assert r.stdout.strip() == want, r.stderr


def test_a_read_only_file(shared_dir):
    os.chmod(shared_dir, 0o777)  # the folder takes new files: only the file refuses
    target = os.path.join(shared_dir, "out.jsonl")
    with open(target, "w") as f:
        f.write("kept\n")
    os.chmod(target, 0o444)
    want = f"{target}: the file cannot be written (Permission denied)"
    if os.geteuid() != 0:
        assert _check_error(target) == want
    else:
        r = _check_in_child(target, as_nobody=True)
        assert r.stdout.strip() == want, r.stderr
    with open(target) as f:
        assert f.read() == "kept\n"


def test_a_read_only_mount(shared_dir):
    """A read-only bind mount (EROFS) refuses root too; needs a private mount namespace
    (``unshare -m``: root with CAP_SYS_ADMIN)."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    target = os.path.join(shared_dir, "out.jsonl")
    mount = ("unshare", "-m", "--propagation", "private", "sh", "-c",
             'mount --bind -o ro "$1" "$1" && shift && exec "$@"', "sh", shared_dir)
    r = _check_in_child(target, prefix=mount)
    if r.returncode != 0:
        pytest.skip(f"no private read-only mount here: {r.stderr.strip()[:80]}")
    assert r.stdout.strip() == (f"{target}: cannot write a file in {shared_dir} "
                                "(Read-only file system)"), r.stderr
