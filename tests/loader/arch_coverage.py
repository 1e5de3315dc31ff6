"""Classify every mlx-lm architecture: identical to mlx-lm, refused with a reason, or not.

For each architecture a tiny random model (:mod:`tests.loader.tiny_archs`) runs two prompts
(13 and 4 token ids, never EOS) through mlx-lm's ``generate_step`` (greedy, one prompt at a
time, the model's own caches: the oracle) and through :class:`LLMEngine` (both prompts
batched, block size 4 so the long prompt spans blocks, 6 greedy tokens). Classes:

- ``IDENTICAL``: every token id equal;
- ``DIFFERS``: the engine ran and some id differs (a silent difference: never allowed);
- ``REFUSED``: the engine raised ``UnsupportedModelError`` at load, with its reason;
- ``CRASH``: any other exception (never allowed);
- ``NOT_BUILT``: the tiny configuration does not build or mlx-lm itself cannot run it (no
  oracle; not counted).

Run as a script for the table: ``python -m tests.loader.arch_coverage [names...]``.
"""

from __future__ import annotations

import sys

import mlx.core as mx

from tests.loader.tiny_archs import ARCHS, build

PROMPTS = ([5, 9, 17, 33, 65, 129, 200, 3, 44, 81, 120, 7, 99], [11, 22, 33, 44])
MAX_TOKENS = 6


def _reference(model) -> list[list[int]]:
    from mlx_lm.generate import generate_step

    return [[int(t) for t, _ in generate_step(mx.array(p), model, max_tokens=MAX_TOKENS)]
            for p in PROMPTS]


def _engine(model) -> list[list[int]]:
    from mlxpa.config import EngineConfig
    from mlxpa.engine import LLMEngine
    from mlxpa.request import EngineRequest
    from mlxpa.sampling_params import SamplingParams
    from tests.tiny_models import byte_tokenizer

    eng = LLMEngine(EngineConfig(block_size=4, num_blocks=64), model, byte_tokenizer())
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = {int(o.request_id): o.token_ids for o in eng.generate(
        EngineRequest(str(i), list(p), params) for i, p in enumerate(PROMPTS))}
    return [outs[i] for i in range(len(PROMPTS))]


def classify(name: str) -> tuple[str, str]:
    """``(class, detail)`` of architecture ``name`` (see the module docstring)."""
    try:
        model = build(name)
        ref = _reference(model)
    except BaseException as e:  # noqa: BLE001 - olmo's import calls sys.exit
        if isinstance(e, KeyboardInterrupt):
            raise
        return "NOT_BUILT", f"{type(e).__name__}: {str(e)[:120]}".replace("\n", " ")
    try:
        got = _engine(model)
    except Exception as e:  # noqa: BLE001 - classified, not raised
        if type(e).__name__ == "UnsupportedModelError":
            return "REFUSED", e.reason
        return "CRASH", f"{type(e).__name__}: {str(e)[:160]}".replace("\n", " ")
    if got == ref:
        return "IDENTICAL", ""
    return "DIFFERS", f"engine {got} vs mlx-lm {ref}"


def main(names: list[str]) -> None:
    counts: dict[str, int] = {}
    for name in names or ARCHS:
        cls, detail = classify(name)
        counts[cls] = counts.get(cls, 0) + 1
        print(f"| `{name}` | {cls} | {detail.replace('|', '/')} |", flush=True)
    print(counts)


if __name__ == "__main__":
    main(sys.argv[1:])
