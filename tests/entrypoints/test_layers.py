"""``LLM`` takes the input processor straight to the engine: in a fresh interpreter, text,
token-id and chat prompts load no module of the file pipeline (``mlxpa.data``,
``mlxpa.batch``), and neither does a dict prompt, mlxpa's row extension, which the request
schema reads (``mlxpa.inputs.schema``) as the file run's envelope hands it a row."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
from mlxpa import LLM, SamplingParams

def loaded():
    return sorted(m for m in sys.modules if m.startswith(("mlxpa.data", "mlxpa.batch")))

llm = LLM({folder!r}, kv_cache_memory_bytes=2**22)
params = SamplingParams(max_tokens=2)
llm.generate(["a text", [5, 6, 7]], params, use_tqdm=False)
llm.chat([{{"role": "user", "content": "hi"}}], params, use_tqdm=False)
list(llm.generate_iter(iter(["x", [8, 9]]), params))
print(",".join(loaded()))
llm.generate({{"id": "r", "prompt": "a row"}}, params, use_tqdm=False)
print(",".join(loaded()), "mlxpa.inputs.schema" in sys.modules)
"""


def test_no_prompt_of_llm_touches_the_file_pipeline(folder):
    r = subprocess.run([sys.executable, "-c", CODE.format(folder=folder)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    before, after = r.stdout.splitlines()
    assert before == "", before
    assert after == " True", after  # the dict prompt: the request schema, no file module
