"""What ``LLM()`` says while it loads: its load errors name the arguments as Python spells them
(``model='x'``, not the command line's ``--model x``) in one line without a chained traceback,
and the loader's lines (loading, an adapter applied, loaded) reach stderr unless the program
configured logging itself."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import huggingface_hub
import pytest

from mlxpa import LLM
from mlxpa.loader.hub import HubModelError
from tests.loader.folders import write_adapter
from tests.loader.test_hub import REPO, FakeHub, _unreachable, hub  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]


def test_hub_id_offline_names_model_keyword_without_a_chain(hub, monkeypatch):  # noqa: F811
    monkeypatch.setattr(huggingface_hub, "snapshot_download", FakeHub(hub, _unreachable()))
    with pytest.raises(HubModelError) as info:
        LLM(model=REPO)
    err = info.value
    assert str(err).startswith(f"model='{REPO}' is not a local folder, the Hugging Face Hub "
                               "cannot be reached (ConnectError) and it is not in the cache")
    assert "--model" not in str(err)
    assert err.__cause__ is None and err.__suppress_context__
    shown = "".join(traceback.format_exception(err))
    assert "The above exception" not in shown and "During handling" not in shown
    assert "ConnectError: no" not in shown  # the Hub client's own exceptions are not shown


def test_local_paths_name_their_keywords(tmp_path, folder):
    with pytest.raises(FileNotFoundError, match=f"^model='{tmp_path}/none': no such folder or "
                       "file$"):
        LLM(model=str(tmp_path / "none"))
    with pytest.raises(FileNotFoundError,
                       match=f"^adapter_path='{tmp_path}/none': no such folder"):
        LLM(folder, adapter_path=str(tmp_path / "none"))
    with pytest.raises(ValueError, match=f"^revision='v1' applies to a Hugging Face repo id, "
                       f"not to model='{folder}'$"):
        LLM(folder, revision="v1")


def _python(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


def test_loading_lines_on_stderr_unless_logging_is_configured(tmp_path, folder):
    adapter = write_adapter(tmp_path / "adapter", folder, "lora", num_layers=2)
    load = (f"from mlxpa import LLM\nllm = LLM({folder!r}, adapter_path={adapter!r}, "
            "kv_cache_memory_bytes=2**22)\nprint(llm.generate('ab', use_tqdm=False)[0]"
            ".outputs[0].text is not None)\n")
    r = _python(tmp_path, load)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "True\n"
    lines = r.stderr.splitlines()
    assert lines[0] == f"Loading the model {folder} ..."
    assert lines[1] == f"Applied the lora adapter {adapter} to the last 2 layers"
    assert lines[2].startswith(f"Loaded {folder} in ") and len(lines) == 3
    r = _python(tmp_path, "import logging\nlogging.basicConfig(level=logging.WARNING)\n" + load)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
