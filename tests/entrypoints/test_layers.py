"""``LLM`` on text, token-id and chat prompts takes the input processor straight to the engine:
in a fresh interpreter, such calls load no module of the file pipeline (``mlxpa.data``, the
row-to-request code of ``mlxpa.batch``); a dict prompt, mlxpa's row extension, loads the row
parser then."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
from mlxpa import LLM, SamplingParams

def loaded():
    return sorted(m for m in sys.modules if m.startswith(("mlxpa.data", "mlxpa.batch"))
                  or m == "mlxpa.entrypoints.rows")

llm = LLM({folder!r}, kv_cache_memory_bytes=2**22)
params = SamplingParams(max_tokens=2)
llm.generate(["a text", [5, 6, 7]], params, use_tqdm=False)
llm.chat([{{"role": "user", "content": "hi"}}], params, use_tqdm=False)
list(llm.generate_iter(iter(["x", [8, 9]]), params))
print(",".join(loaded()))
llm.generate({{"id": "r", "prompt": "a row"}}, params, use_tqdm=False)
print(",".join(loaded()))
"""


def test_text_token_id_and_chat_prompts_never_touch_the_file_pipeline(folder):
    r = subprocess.run([sys.executable, "-c", CODE.format(folder=folder)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    before, after = (set(filter(None, line.split(","))) for line in r.stdout.splitlines())
    assert not before, before
    assert {"mlxpa.entrypoints.rows", "mlxpa.data.rows", "mlxpa.batch.requests"} <= after
