"""Every architecture of the installed mlx-lm: identical to mlx-lm or refused with a reason.

See :mod:`tests.loader.arch_coverage` for the oracle (mlx-lm's ``generate_step`` greedy ids on
the same tiny random model). No architecture may crash or differ silently; the expected class
of each is pinned so a regression (or a config that stops building) fails.
"""

from __future__ import annotations

import pytest

from tests.loader.arch_coverage import classify
from tests.loader.tiny_archs import ARCHS

IDENTICAL = {
    "afmoe", "apertus", "bailing_moe", "cohere", "cohere2", "dbrx", "deepseek", "deepseek_v2",
    "dots1", "ernie4_5", "ernie4_5_moe", "exaone", "exaone4", "exaone_moe", "gear", "gemma",
    "gemma3", "gemma3_text", "gemma4", "gemma4_text", "glm", "glm4", "glm4_moe", "gpt2",
    "gpt_neox", "gpt_oss", "gptj", "granite", "granitemoe", "helium", "hunyuan",
    "hunyuan_v1_dense", "internlm2", "internlm3", "Klear", "laguna", "lille-130m", "llama",
    "llama4_text", "mellum", "mimo", "minicpm", "minicpm3", "minimax", "ministral3", "mistral3",
    "mixtral", "muse_glimmer", "nanbeige", "nanochat", "nemotron", "olmo2", "olmo3", "olmoe",
    "openelm", "phi", "phi3", "phimoe", "phixtral", "pixtral", "qwen2", "qwen2_moe", "qwen2_vl",
    "qwen3", "qwen3_moe", "qwen3_vl", "qwen3_vl_moe", "seed_oss", "smollm3", "solar_open",
    "stablelm", "starcoder2", "step3p5", "talkie", "telechat3", "youtu_llm",
}
REFUSED = {
    "afm7", "bailing_hybrid", "bailing_moe_v3", "deepseek_v3", "deepseek_v32", "deepseek_v41",
    "falcon_h1", "gemma2", "glm4_moe_lite", "gpt_bigcode", "granitemoehybrid", "iquestloopcoder",
    "jamba", "kimi_k25", "kimi_vl", "lfm2", "mamba", "mamba2", "minimax_m3_vl", "mistral4",
    "nemotron_h", "phi3small", "plamo", "plamo2", "plamo3", "qwen3_next", "recurrent_gemma",
}
# The tiny configuration does not build, or mlx-lm itself cannot run it on this machine
# (bitnet / muse_spark: Metal kernels only; olmo: needs ai2-olmo; prism_hadamard_qwen35: a
# quantized pack format, not a float architecture).
NOT_BUILT = {
    "baichuan_m1", "bailing_moe_linear", "bitnet", "gemma3n", "glm_moe_dsa", "kimi_k3",
    "kimi_linear", "lfm2-vl", "lfm2_moe", "llama4", "longcat_flash", "longcat_flash_ngram",
    "mimo_v2_flash", "muse_spark", "nemotron-nas", "olmo", "olmo_hybrid", "prism_hadamard_qwen35",
    "qwen", "qwen3_5", "qwen3_5_moe", "rwkv7", "spark2_5",
}


def test_every_architecture_is_listed():
    assert set(ARCHS) == IDENTICAL | REFUSED | NOT_BUILT


@pytest.mark.parametrize("name", ARCHS)
def test_architecture(name):
    cls, detail = classify(name)
    assert cls in ("IDENTICAL", "REFUSED", "NOT_BUILT"), f"{name}: {cls}: {detail}"
    expected = ("IDENTICAL" if name in IDENTICAL else "REFUSED" if name in REFUSED
                else "NOT_BUILT")
    assert cls == expected, f"{name}: {cls}: {detail}"
    if cls == "REFUSED":
        assert detail, name
