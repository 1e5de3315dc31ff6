"""At load time, run two short rows through the paged path and compare with mlx-lm.

The check is the engine's guarantee that a model it accepts does not crash mid-run and does
not silently differ from mlx-lm: two prompts of different lengths are prefilled together as
one right-padded batch (per-row offsets, padding, block tables), then decoded together one
token, exactly as :class:`mlxpa.worker.model_runner.ModelRunner` runs them; the log-probabilities at
every sampled position must match mlx-lm's own forward (``make_prompt_cache``, one prompt at
a time) within float tolerance. Anything else is an :class:`UnsupportedModelError` naming the
failure. The body/LM-head split (see :func:`find_head_split`) is accepted only when it passes
the same check; otherwise the full model runs.

With quantized pools (``--kv-cache-dtype``) the paged path runs on pools quantized as the
engine's, and mlx-lm's forward on caches that store each K/V row quantized and dequantized at
the same bits (:func:`mlxpa.worker.kv_storage.round_trip_caches`): the same attention over
the same values, so the same float tolerance holds.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxpa.loader.errors import UnsupportedModelError
from mlxpa.worker.kv_cache import PagedKVCache
from mlxpa.worker.kv_storage import KVStorage, kv_storage, round_trip_caches
from mlxpa.worker.model_probe import ModelGeometry, reference_logits
from mlxpa.worker.paged_forward import (
    HeadSplit,
    build_metadata,
    find_head_split,
    forward,
    paged_context,
)
from mlxpa.worker.state_store import RecurrentStateStore

PROMPTS = ((2, 7, 1, 8, 2, 8, 1, 8, 2), (3, 1, 4, 1, 5))
DECODE_TOKEN = 6
# Largest accepted |log-prob difference| (nats) per compute dtype: float32 reassociation and
# the fused CPU ops stay below 1e-4 on the models tested; a dropped mask term or an attention
# computed elsewhere gives 0.1 and more.
TOLERANCE = {mx.float32: 1e-2, mx.float16: 0.25, mx.bfloat16: 0.25}


def _log_softmax(x: mx.array) -> mx.array:
    x = x.astype(mx.float32)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def _reference(model: nn.Module, storage: KVStorage) -> list[mx.array]:
    """Per prompt: mlx-lm's log-probs after the prompt, then after ``DECODE_TOKEN``."""
    out = []
    for prompt in PROMPTS:
        logits, caches = reference_logits(model, list(prompt),
                                          round_trip_caches(model, storage.specs))
        step = model(mx.array([[DECODE_TOKEN]]), cache=caches)[0, -1]
        out.append(mx.stack([_log_softmax(logits[-1]), _log_softmax(step)]))
    return out


def _steps(store: RecurrentStateStore | None) -> list[tuple[list[int], np.ndarray]]:
    """``(rows, tokens)`` per step: both prompts prefilled as one right-padded batch (with a
    recurrent-state model: one group per prompt length, as the runner groups them), then
    one decode step for both."""
    lens = [len(p) for p in PROMPTS]
    groups = [[i] for i in range(len(PROMPTS))] if store is not None else [
        list(range(len(PROMPTS)))]
    steps = []
    for rows in groups:
        tokens = np.zeros((len(rows), max(lens[i] for i in rows)), np.int32)
        for k, i in enumerate(rows):
            tokens[k, :lens[i]] = PROMPTS[i]
        steps.append((rows, tokens))
    rows = list(range(len(PROMPTS)))
    return [*steps, (rows, np.full((len(rows), 1), DECODE_TOKEN, np.int32))]


def _paged(model: nn.Module, geometry: ModelGeometry, split: HeadSplit | None,
           block_size: int, kernel: str, fused: bool, storage: KVStorage) -> list[mx.array]:
    """The same two steps through the paged path, both prompts batched."""
    lens = [len(p) for p in PROMPTS]
    per_row = -(-(max(lens) + 1) // block_size)
    pool = PagedKVCache(storage.specs, 1 + per_row * len(PROMPTS), block_size, geometry.dtype)
    tables = [np.arange(1 + i * per_row, 1 + (i + 1) * per_row, dtype=np.int32)
              for i in range(len(PROMPTS))]
    done = [0] * len(PROMPTS)
    results: list[list[mx.array]] = [[] for _ in PROMPTS]
    store = RecurrentStateStore.for_geometry(geometry)
    with paged_context(model, fused, geometry.has_kv):
        for rows, toks in _steps(store):
            counts = [1 if done[i] else lens[i] for i in rows]
            starts = [done[i] for i in rows]
            tok, meta = build_metadata(toks, counts, np.array(starts, np.int32),
                                       [tables[i][:-(-(done[i] + n) // block_size)]
                                        for i, n in zip(rows, counts)], block_size,
                                       geometry.windows, kernel)
            states = store.caches(rows, starts, counts) if store is not None else None
            logits = forward(model, split, pool, geometry.windows, tok, meta,
                             list(range(len(rows))), [n - 1 for n in counts],
                             geometry.gathered, states, geometry.layout)
            if store is not None:
                store.save(rows, starts, counts, states)
            mx.eval(logits, pool.arrays(), store.arrays() if store is not None else [])
            for k, i in enumerate(rows):
                results[i].append(_log_softmax(logits[k]))
                done[i] += counts[k]
    return [mx.stack(r) for r in results]


def _difference(model, geometry, split, block_size, kernel, fused, ref,
                storage) -> str | None:
    """Why the paged path fails the check (None when it passes)."""
    try:
        got = _paged(model, geometry, split, block_size, kernel, fused, storage)
    except Exception as e:  # noqa: BLE001 - any failure of the paged path is the answer
        return f"the paged forward pass fails: {type(e).__name__}: {e}"
    worst = max(mx.abs(g - r).max().item() for g, r in zip(got, ref))
    if not worst <= TOLERANCE.get(geometry.dtype, 0.25):
        extra = (" (the model passes its own mask or score terms to the attention, e.g. "
                 "latent attention)" if geometry.array_mask else "")
        return (f"the paged path differs from mlx-lm on the load check by {worst:.3g} nats "
                f"of log-probability{extra}")
    return None


def check_paged_path(model: nn.Module, geometry: ModelGeometry, block_size: int,
                     kernel: str = "auto", fused: bool = True,
                     storage: KVStorage | None = None) -> HeadSplit | None:
    """Verify the paged path against mlx-lm (see the module docstring).

    Args:
        storage: How the pools store K/V (None: the compute dtype).

    Returns:
        The body/LM-head split to use, or None to run the full model.

    Raises:
        UnsupportedModelError: The paged path fails or differs, with and without the split.
    """
    storage = storage or kv_storage(geometry)
    ref = _reference(model, storage)
    split = find_head_split(model)
    if split is not None and _difference(model, geometry, split, block_size, kernel, fused,
                                         ref, storage) is None:
        return split
    why = _difference(model, geometry, None, block_size, kernel, fused, ref, storage)
    if why:
        raise UnsupportedModelError(geometry.model_type, why)
    return None
