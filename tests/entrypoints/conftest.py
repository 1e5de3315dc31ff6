"""A tiny random llama saved as a model folder (byte tokenizer, EOS id 1) with a chat template
that shows its variables, and an ``LLM`` on it."""

from __future__ import annotations

import pytest

from tests.tiny_models import save_tiny_model

# Raises on an unknown role (as real templates do); shows a "style" variable and the
# generation prompt.
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] not in ['user', 'assistant', 'system'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if style %}[{{ style }}] {% endif %}{% if add_generation_prompt %}assistant:{% endif %}")
KV_BYTES = 2**22  # the KV pool's budget: 512 blocks of the tiny model


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return save_tiny_model(tmp_path_factory.mktemp("m") / "tiny", chat_template=TEMPLATE)


@pytest.fixture(scope="module")
def llm(folder):
    from mlxpa import LLM

    return LLM(folder, kv_cache_memory_bytes=KV_BYTES)


@pytest.fixture(scope="module")
def mlx_lm_model(folder):
    """The same folder loaded by mlx-lm itself (the oracle's model and tokenizer)."""
    from mlx_lm import load

    return load(folder)
