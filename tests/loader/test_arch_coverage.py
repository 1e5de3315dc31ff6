"""Every architecture of the installed mlx-lm: identical to mlx-lm or refused with a reason.

See :mod:`tests.loader.arch_coverage` for the oracle (mlx-lm's ``generate_step`` greedy ids on
the same tiny random model). No architecture may crash or differ silently; the expected class
of each is pinned so a regression (or a config that stops building) fails.
"""

from __future__ import annotations

import pytest

from tests.loader.arch_coverage import classify
from tests.loader.tiny_archs import ARCHS

SLOW_ARCHS = {"gemma4"}  # the one architecture of the sweep among the slowest tests

IDENTICAL = {
    "afmoe", "apertus", "baichuan_m1", "bailing_hybrid", "bailing_moe", "bailing_moe_linear",
    "bailing_moe_v3", "cohere", "cohere2", "dbrx", "deepseek", "deepseek_v2", "deepseek_v3",
    "dots1", "ernie4_5", "ernie4_5_moe", "exaone", "exaone4", "exaone_moe", "falcon_h1", "gear",
    "gemma", "gemma3", "gemma3_text", "gemma3n", "gemma4", "gemma4_text", "glm", "glm4",
    "glm4_moe", "glm4_moe_lite", "gpt2", "gpt_neox", "gpt_oss", "gptj", "granite", "granitemoe",
    "granitemoehybrid", "helium", "hunyuan", "hunyuan_v1_dense", "internlm2", "internlm3", "jamba",
    "kimi_k25", "kimi_k3", "kimi_linear", "kimi_vl", "Klear", "laguna", "lfm2", "lfm2-vl",
    "lfm2_moe", "lille-130m", "llama", "llama4_text", "longcat_flash", "longcat_flash_ngram",
    "mamba", "mamba2", "mellum", "mimo", "mimo_v2_flash", "minicpm", "minicpm3", "minimax",
    "minimax_m3_vl", "ministral3", "mistral3", "mistral4", "mixtral", "muse_glimmer", "nanbeige",
    "nanochat", "nemotron", "nemotron-nas", "nemotron_h", "olmo2", "olmo3", "olmo_hybrid", "olmoe",
    "openelm", "phi", "phi3", "phimoe", "phixtral", "pixtral", "plamo", "qwen", "qwen2",
    "qwen2_moe", "qwen2_vl", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_moe", "qwen3_next",
    "qwen3_vl", "qwen3_vl_moe", "recurrent_gemma", "rwkv7", "seed_oss", "smollm3", "solar_open",
    "spark2_5", "stablelm", "starcoder2", "step3p5", "talkie", "telechat3", "youtu_llm",
}
REFUSED = {
    "afm7", "deepseek_v32", "deepseek_v41", "gemma2", "glm_moe_dsa", "gpt_bigcode",
    "iquestloopcoder", "llama4", "phi3small", "plamo2", "plamo3",
}
# Not applicable: mlx-lm itself cannot run them here (bitnet / muse_spark: Metal kernels
# only; olmo: needs ai2-olmo) or they are not a float architecture (prism_hadamard_qwen35: a
# 2-bit Hadamard-rotated quantized pack of qwen3_5, which is covered itself).
NOT_BUILT = {
    "bitnet", "muse_spark", "olmo", "prism_hadamard_qwen35",
}


def test_every_architecture_is_listed():
    assert set(ARCHS) == IDENTICAL | REFUSED | NOT_BUILT


@pytest.mark.parametrize("name", [pytest.param(a, marks=pytest.mark.slow) if a in SLOW_ARCHS
                                  else a for a in ARCHS])
def test_architecture(name):
    cls, detail = classify(name)
    assert cls in ("IDENTICAL", "REFUSED", "NOT_BUILT"), f"{name}: {cls}: {detail}"
    expected = ("IDENTICAL" if name in IDENTICAL else "REFUSED" if name in REFUSED
                else "NOT_BUILT")
    assert cls == expected, f"{name}: {cls}: {detail}"
    if cls == "REFUSED":
        assert detail, name
