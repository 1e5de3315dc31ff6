"""Hugging Face repo ids for ``--model``: found in the cache with no request, downloaded
through ``huggingface_hub.snapshot_download`` (a fake here: tests never reach a network) with
the files mlx-lm loads and ``--revision``, and one line for each way it cannot be had."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx2
import huggingface_hub
import pytest
from huggingface_hub import constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS
from typer.testing import CliRunner

from mlxpa.cli import app
from mlxpa.config import EngineConfig
from mlxpa.loader.hub import HubModelError
from mlxpa.loader.models import load_model, resolve_model
from tests.tiny_models import save_tiny_model

ROOT = Path(__file__).resolve().parents[2]
REPO = "tiny-org/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def place_in_cache(hub: Path, repo_id: str = REPO, ref: str = "main",
                   commit: str = COMMIT) -> Path:
    """A tiny model in huggingface_hub's cache layout under ``hub`` (``$HF_HOME/hub``):
    ``models--owner--name/snapshots/<commit>/`` and ``refs/<ref>`` naming the commit."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    save_tiny_model(snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty cache as huggingface_hub reads it, online, with every request refused."""
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def no_network(*args, **kwargs):
        raise AssertionError("a test reached for the network")

    monkeypatch.setattr(huggingface_hub.HfApi, "repo_info", no_network)
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_tree", no_network)
    return cache


def test_cached_repo_is_found_without_a_request(hub):
    snapshot = place_in_cache(hub)
    assert resolve_model(REPO) == snapshot
    model, _, folder = load_model(EngineConfig(model=REPO))
    assert folder == snapshot and model.args.hidden_size == 64


def test_revision_picks_the_cached_ref(hub):
    other = "fedcba9876543210fedcba9876543210fedcba98"
    place_in_cache(hub)
    v1 = place_in_cache(hub, ref="v1", commit=other)
    assert resolve_model(REPO, revision="v1") == v1
    assert resolve_model(REPO, revision=other) == v1  # a commit names its snapshot


class FakeHub:
    """``snapshot_download`` that records its calls and "downloads" a tiny model into the
    cache; ``error`` makes the download raise instead."""

    def __init__(self, hub: Path, error: Exception | None = None) -> None:
        self.hub, self.error, self.calls = hub, error, []

    def __call__(self, repo_id, **kwargs):
        self.calls.append({"repo_id": repo_id, **kwargs})
        snapshot = self.hub / f"models--{repo_id.replace('/', '--')}" / "snapshots" / COMMIT
        if kwargs.get("local_files_only"):
            if not (snapshot / "config.json").exists():
                raise LocalEntryNotFoundError("not in the cache")
            return str(snapshot)
        if self.error is not None:
            raise self.error
        return str(place_in_cache(self.hub, repo_id, kwargs.get("revision") or "main"))


def test_download_call_and_then_the_cache(hub, monkeypatch, caplog):
    fake = FakeHub(hub)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    with caplog.at_level("INFO", logger="mlxpa.loader.hub"):
        model, _, folder = load_model(EngineConfig(model=REPO, revision="v1"))
    lookup, download = fake.calls
    assert lookup == {"repo_id": REPO, "revision": "v1", "local_files_only": True,
                      "allow_patterns": DEFAULT_ALLOW_PATTERNS}
    # The files mlx-lm loads, the revision; the token and progress bars are
    # huggingface_hub's own (HF_TOKEN, stderr).
    assert download == {"repo_id": REPO, "revision": "v1",
                        "allow_patterns": DEFAULT_ALLOW_PATTERNS}
    assert f"Downloading {REPO} (revision v1) from the Hugging Face Hub into {hub}" in caplog.text
    assert folder == hub / f"models--tiny-org--tiny-llama/snapshots/{COMMIT}"
    fake.calls.clear()
    assert load_model(EngineConfig(model=REPO, revision="v1"))[2] == folder
    assert [c["local_files_only"] for c in fake.calls] == [True]  # cached: no download


def _rows(tmp_path) -> Path:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "hello"}\n{"prompt": "abc"}\n')
    return rows


def test_revision_option_reaches_every_resolution(hub, monkeypatch, tmp_path):
    """``--revision`` on run and plan: the peeks before the load and the load itself."""
    fake = FakeHub(hub)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    rows = _rows(tmp_path)
    r = CliRunner().invoke(app, ["plan", str(rows), "--model", REPO, "--revision", "v2"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["run", str(rows), "-o", str(tmp_path / "o.jsonl"), "--model",
                                 REPO, "--revision", "v2", "--max-tokens", "2", "-q"])
    assert r.exit_code == 0, r.output
    assert len(fake.calls) >= 3 and {c["revision"] for c in fake.calls} == {"v2"}
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 2


def _http(cls, status: int):
    request = httpx2.Request("GET", f"https://huggingface.co/api/models/{REPO}")
    return cls(f"{status} error", response=httpx2.Response(status, request=request))


def _unreachable():
    try:
        raise LocalEntryNotFoundError("cannot find the snapshot") from httpx2.ConnectError("no")
    except LocalEntryNotFoundError as e:
        return e


@pytest.mark.parametrize("error,expected", [
    (_http(GatedRepoError, 403), f"--model {REPO} is a gated repo: accept its terms on "
     f"https://huggingface.co/{REPO}, then set HF_TOKEN"),
    (_http(RepositoryNotFoundError, 404), f"--model {REPO}: no such local folder, and no such "
     "model repo on the Hugging Face Hub (a private repo needs HF_TOKEN"),
    (_http(RevisionNotFoundError, 404), f"--model {REPO}: the Hub has no revision 'v9' of it"),
    (_unreachable(), f"--model {REPO} --revision v9 is not a local folder, the Hugging Face "
     f"Hub cannot be reached (ConnectError) and it is not in the cache"),
    (_http(HfHubHTTPError, 503), f"--model {REPO} --revision v9: the Hugging Face Hub "
     f"answered HTTP 503; try again later or fetch it by hand (`hf download {REPO} "
     "--revision v9`)"),
], ids=["gated", "no-repo", "no-revision", "unreachable", "http-503"])
def test_each_failure_is_one_line(hub, monkeypatch, tmp_path, error, expected):
    monkeypatch.setattr(huggingface_hub, "snapshot_download", FakeHub(hub, error))
    with pytest.raises(HubModelError) as info:
        resolve_model(REPO, revision="v9")
    message = str(info.value)
    assert message.startswith(expected) and "\n" not in message
    r = CliRunner().invoke(app, ["plan", str(_rows(tmp_path)), "--model", REPO,
                                 "--revision", "v9"])
    assert r.exit_code == 1 and r.output.startswith("error: " + expected[:40])


def test_offline_never_downloads(hub, monkeypatch):
    fake = FakeHub(hub)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubModelError, match=f"`hf download {REPO}`, with the same HF_HOME"):
        resolve_model(REPO)
    assert [c["local_files_only"] for c in fake.calls] == [True]


def test_revision_of_a_local_model_is_refused(tmp_path):
    folder = save_tiny_model(tmp_path / "m")
    with pytest.raises(ValueError, match="--revision v1 applies to a Hugging Face repo id"):
        resolve_model(folder, revision="v1")


def _cli(tmp_path, *args) -> subprocess.CompletedProcess:
    """``mlxpa`` in a fresh process whose huggingface_hub reads HF_HOME and HF_HUB_OFFLINE
    from the environment, as a user's does."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-m", "mlxpa", *args], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)


def test_cli_loads_from_the_hf_home_cache_offline(tmp_path):
    """HF_HOME's cache, HF_HUB_OFFLINE=1: the model loads with no request at all, and the
    texts are mlx-lm's on the same snapshot."""
    from mlx_lm import generate, load

    snapshot = place_in_cache(tmp_path / "hf" / "hub")
    r = _cli(tmp_path, "run", str(_rows(tmp_path)), "-o", "out.jsonl", "--model", REPO,
             "--max-tokens", "5")
    assert r.returncode == 0, r.stderr
    assert f"Loading the model {snapshot} ..." in r.stderr
    model, tok = load(str(snapshot))
    want = [generate(model, tok, p, max_tokens=5) for p in ("hello", "abc")]
    got = [json.loads(line)["text"] for line in (tmp_path / "out.jsonl").read_text().split("\n")
           if line]
    assert got == want


def test_cli_offline_message(tmp_path):
    r = _cli(tmp_path, "run", str(_rows(tmp_path)), "-o", "out.jsonl", "--model",
             "tiny-org/not-cached")
    assert r.returncode == 1
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert lines == [
        f"error: --model tiny-org/not-cached is not a local folder, not in the Hugging Face "
        f"cache ({tmp_path}/hf/hub), and HF_HUB_OFFLINE is set, so it is not downloaded: fetch "
        "it where a network exists (`hf download tiny-org/not-cached`, with the same "
        "HF_HOME), or unset HF_HUB_OFFLINE"]
    assert not (tmp_path / "out.jsonl").exists()


def test_run_tries_a_failed_download_once(hub, monkeypatch, tmp_path):
    """The first peek at the model (before any row is read) raises; no second attempt."""
    fake = FakeHub(hub, _unreachable())
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    r = CliRunner().invoke(app, ["run", str(_rows(tmp_path)), "-o", str(tmp_path / "o.jsonl"),
                                 "--model", REPO, "-q"])
    assert r.exit_code == 1 and "the Hugging Face Hub cannot be reached" in r.output
    assert [c.get("local_files_only", False) for c in fake.calls] == [True, False]
    assert "rows checked" not in r.output
