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
engine's. Comparing it with mlx-lm quantizing its own K/V would not work: the paged forward's
K/V differ from mlx-lm's in the last float bits (other batch shapes, fused ops), which moves
some elements across a rounding boundary, and one such element in a large channel moves the
next layers' log-probabilities by tenths of a nat (measured on Gemma 3 270M at 8 bits: a
1e-7 relative change of the K/V shifts mlx-lm's own quantized-cache log-probabilities by up to
0.8 nats on these prompts). So mlx-lm's forward runs on the values the pools stored instead:
each quantized entry's cache replaces every new K/V row by the pool's dequantized row for that
position, after checking that it lies within 1.5 quantization steps (plus float slack) of
mlx-lm's own row (a write at the wrong slot, lost biases or scales fail this); the attention
over identical values then agrees within the same float tolerance.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxpa.kernels.quant import dequantize
from mlxpa.kernels.reference import gather_kv
from mlxpa.loader.errors import UnsupportedModelError
from mlxpa.utils import cdiv
from mlxpa.worker.forward_plan import ForwardPlan, Positions, ReadKind
from mlxpa.worker.kv_cache import PagedKVCache
from mlxpa.worker.kv_storage import KVStorage, kv_storage
from mlxpa.worker.model_probe import ModelGeometry, cache_entries, reference_logits
from mlxpa.worker.paged_forward import (
    HeadSplit,
    build_metadata,
    find_head_split,
    forward,
    layer_map,
    lm_head,
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


def _reference(model: nn.Module, make_caches=None) -> list[mx.array]:
    """Per prompt: mlx-lm's log-probs after the prompt, then after ``DECODE_TOKEN``
    (``make_caches(i)``: the caches of prompt ``i``; default mlx-lm's own)."""
    out = []
    for i, prompt in enumerate(PROMPTS):
        caches = make_caches(i) if make_caches is not None else None
        logits, caches = reference_logits(model, list(prompt), caches)
        step = model(mx.array([[DECODE_TOKEN]]), cache=caches)[0, -1]
        out.append(mx.stack([_log_softmax(logits[-1]), _log_softmax(step)]))
    return out


class _Stored:
    """Mixed into an mlx-lm cache class: each new K/V row is replaced by the row the paged
    pool stored for its position (``mlxpa_stored``: per K and V, the dequantized rows and the
    deviation each element may have from mlx-lm's own), the worst ratio appended to
    ``mlxpa_worst``."""

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        start, n = self.offset, keys.shape[2]
        rows = []
        for new, (stored, allowed) in zip((keys, values), self.mlxpa_stored):
            row = stored[:, :, start:start + n]
            gap = mx.abs(new.astype(mx.float32) - row) / allowed[:, :, start:start + n]
            self.mlxpa_worst.append(gap.max())
            rows.append(row.astype(new.dtype))
        return super().update_and_fetch(*rows)


_STORED_CLASSES: dict[type, type] = {}


def _stored_rows(pool: PagedKVCache, slot: int, table: np.ndarray) -> list[tuple]:
    """Per K and V of a quantized entry, one row's ``[1, h, S, D]`` float32 values as the
    pool stores them and the deviation allowed from the row they quantize: 1.5 quantization
    steps (MLX's affine rounding makes the larger-magnitude edge of a group exact and fits the
    step to it, so an element may sit up to one step from its value: 0.9999 measured on
    random groups; half a step of margin), plus float slack for the two forward passes'
    rounding (relative 1e-4 in float32, 2e-2 in half precision, of the group's largest
    magnitude). A lost bias is off by the group's edge, many steps."""
    slack = 1e-4 if pool.dtype == mx.float32 else 2e-2
    out = []
    for cache in (pool.key_caches[slot], pool.value_caches[slot]):
        g = gather_kv(cache, mx.array(table[None]))
        scales, biases = (mx.repeat(mx.abs(a.astype(mx.float32)), g.group_size, axis=-1)
                          for a in (g.scales, g.biases))
        allowed = 1.5 * scales + slack * (biases + scales * (2**g.bits - 1)) + 1e-30
        out.append((dequantize(g).astype(mx.float32), allowed))
    return out


def _stored_reference(model: nn.Module, storage: KVStorage, pool: PagedKVCache,
                      tables: list[list[np.ndarray]]) -> tuple[list[mx.array], float]:
    """:func:`_reference` with each quantized entry's K/V rows replaced by the pool's (see
    the module docstring); and the worst deviation of a stored row from mlx-lm's own, in
    allowed deviations (at most 1 when the writes are right)."""
    from mlx_lm.models.cache import make_prompt_cache

    worst: list[mx.array] = []
    where = storage.entry_slots()

    def make_caches(i: int) -> list:
        caches = make_prompt_cache(model)
        for e, (cache, spec) in enumerate(zip(cache_entries(caches)[0], storage.specs)):
            if spec.k_bits:
                group, slot = where[e]
                base = type(cache)
                if base not in _STORED_CLASSES:
                    _STORED_CLASSES[base] = type(f"Stored{base.__name__}", (_Stored, base), {})
                cache.__class__ = _STORED_CLASSES[base]
                cache.mlxpa_stored = _stored_rows(pool, slot, tables[i][group])
                cache.mlxpa_worst = worst
        return caches

    ref = _reference(model, make_caches)
    return ref, max((w.item() for w in worst), default=0.0)


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
           block_size: int, kernel: str, fused: bool, storage: KVStorage,
           ) -> tuple[list[mx.array], PagedKVCache, list[list[np.ndarray]]]:
    """The same two steps through the paged path, both prompts batched, in the KV cache
    groups of ``storage``; with the pool and each prompt's block table per group."""
    lens = [len(p) for p in PROMPTS]
    per_row = cdiv(max(lens) + 1, block_size)
    layers = layer_map(geometry, storage)
    num_groups = len(layers.group_windows)
    pool = PagedKVCache(storage.slot_specs, 1 + per_row * len(PROMPTS) * num_groups,
                        block_size, geometry.dtype, storage.block_bytes(block_size))
    tables = [[np.arange(1 + (i * num_groups + g) * per_row, 1 + (i * num_groups + g + 1)
                         * per_row, dtype=np.int32) for g in range(num_groups)]
              for i in range(len(PROMPTS))]
    done = [0] * len(PROMPTS)
    results: list[list[mx.array]] = [[] for _ in PROMPTS]
    store = RecurrentStateStore.for_geometry(geometry)
    with paged_context(model, fused, geometry.has_kv):
        for rows, toks in _steps(store):
            counts = [1 if done[i] else lens[i] for i in rows]
            starts = [done[i] for i in rows]
            tok, meta = build_metadata(toks, counts, np.array(starts, np.int32),
                                       [[tables[i][g][:cdiv(done[i] + n, block_size)]
                                         for i, n in zip(rows, counts)]
                                        for g in range(num_groups)], block_size,
                                       layers.group_windows, kernel)
            last = Positions(list(range(len(rows))), [n - 1 for n in counts])
            plan = ForwardPlan(tok, meta, {ReadKind.SAMPLE: last},
                               store.caches(rows, starts, counts) if store is not None else None)
            logits = lm_head(split)(forward(model, split, pool, layers, plan)[ReadKind.SAMPLE])
            if store is not None:
                store.save(rows, starts, counts, plan.states)
            mx.eval(logits, pool.arrays(), store.arrays() if store is not None else [])
            for k, i in enumerate(rows):
                results[i].append(_log_softmax(logits[k]))
                done[i] += counts[k]
    return [mx.stack(r) for r in results], pool, tables


def _difference(model, geometry, split, block_size, kernel, fused, ref,
                storage) -> str | None:
    """Why the paged path fails the check (None when it passes)."""
    try:
        got, pool, tables = _paged(model, geometry, split, block_size, kernel, fused, storage)
    except Exception as e:  # noqa: BLE001 - any failure of the paged path is the answer
        return f"the paged forward pass fails: {type(e).__name__}: {e}"
    if storage.quantized:
        ref, gap = _stored_reference(model, storage, pool, tables)
        if not gap <= 1:
            return (f"a K/V row the quantized pool stored is {gap:.3g} times the rounding "
                    "error away from mlx-lm's own row (the quantized write is wrong)")
    worst = max(mx.abs(g - r).max().item() for g, r in zip(got, ref))
    if not worst <= TOLERANCE.get(geometry.dtype, 0.25):
        extra = (" (the model passes its own mask or score terms to the attention, e.g. "
                 "latent attention)" if geometry.array_mask else "")
        return (f"the paged path differs from mlx-lm on the load check by {worst:.3g} nats "
                f"of log-probability{extra}")
    return None


def verify_and_split(model: nn.Module, geometry: ModelGeometry, block_size: int,
                     kernel: str = "auto", fused: bool = True,
                     storage: KVStorage | None = None) -> HeadSplit | None:
    """Verify the paged path against mlx-lm (see the module docstring) and choose how the
    runner applies the LM head: the body/head split when the path passes with it, else the
    full model.

    Args:
        storage: How the pools store K/V (None: the compute dtype).

    Returns:
        The body/LM-head split to use, or None to run the full model.

    Raises:
        UnsupportedModelError: The paged path fails or differs, with and without the split.
    """
    storage = storage or kv_storage(geometry, block_size=block_size)
    ref = None if storage.quantized else _reference(model)
    split = find_head_split(model)
    if split is not None and _difference(model, geometry, split, block_size, kernel, fused,
                                         ref, storage) is None:
        return split
    why = _difference(model, geometry, None, block_size, kernel, fused, ref, storage)
    if why:
        raise UnsupportedModelError(geometry.model_type, why)
    return None
