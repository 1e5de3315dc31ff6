"""Model and adapter folders written in a test: a tiny model quantized by mlx-lm's own
converter, a random mlx-lm LoRA/DoRA adapter, and greedy ids from the engine and from mlx-lm."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import save_tiny_model

PROMPTS = ["hello world, this is a test", "a", "The quick brown fox jumps over the lazy dog."]
MAX_TOKENS = 10


def tiny_folders(root: Path) -> dict[str, str]:
    """``{"float": ..., "q4": ...}``: a tiny random llama folder and mlx-lm's 4-bit
    conversion of it (``mlx_lm convert -q``: affine, group size 64)."""
    from mlx_lm.convert import convert

    base = save_tiny_model(root / "base")
    q4 = root / "q4"
    convert(hf_path=base, mlx_path=str(q4), quantize=True, q_bits=4, q_group_size=64)
    return {"float": base, "q4": str(q4)}


def write_adapter(folder: Path, base: str, kind: str, num_layers: int = 2, seed: int = 0) -> str:
    """An adapter as ``mlx_lm.lora`` saves one (``adapter_config.json`` and the adapter
    tensors in ``adapters.safetensors``), with random non-zero values (a trained LoRA's
    ``lora_b`` starts at zero, which would make the adapter a no-op).

    The layers are made by mlx-lm's own ``linear_to_lora_layers`` (what ``mlx_lm.lora``
    calls), so the names and shapes are the ones its loader expects.
    """
    from mlx_lm import load
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model, _ = load(base)
    params = {"rank": 4, "scale": 10.0, "dropout": 0.0}
    linear_to_lora_layers(model, num_layers, params, use_dora=kind == "dora")
    mx.random.seed(seed)
    weights = {}
    for name, value in tree_flatten(model.parameters()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("lora_a", "lora_b"):
            weights[name] = mx.random.normal(value.shape) * 0.05
        elif leaf == "m":  # DoRA's magnitudes: the base norms, perturbed
            weights[name] = value * (1 + 0.2 * mx.random.normal(value.shape))
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "adapters.safetensors"), weights)
    (folder / "adapter_config.json").write_text(json.dumps(
        {"fine_tune_type": kind, "num_layers": num_layers, "lora_parameters": params}))
    return str(folder)


def prompt_ids(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(p) for p in PROMPTS]


def mlx_lm_greedy(model, tokenizer) -> list[list[int]]:
    """mlx-lm's greedy ids (``generate_step``, argmax) for every prompt."""
    return [[int(t) for t, _ in generate_step(mx.array(p), model, max_tokens=MAX_TOKENS)]
            for p in prompt_ids(tokenizer)]


def engine_greedy(engine: LLMEngine) -> list[list[int]]:
    """The engine's greedy ids for every prompt, batched."""
    ids = prompt_ids(engine.tokenizer)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = {int(o.request_id): o.token_ids for o in engine.generate(
        EngineRequest(str(i), p, params) for i, p in enumerate(ids))}
    return [outs[i] for i in range(len(ids))]


def engine_for(model: str, **fields) -> LLMEngine:
    """The engine loading ``model`` itself (the load path ``mlxpa run`` takes)."""
    return LLMEngine(EngineConfig(model=model, block_size=8, num_blocks=64, **fields))
