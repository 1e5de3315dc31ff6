"""Model geometry from mlx-lm's own cache objects and one probe forward step.

mlxpa never reads K/V shapes from config attribute names (``num_attention_heads``,
``n_head``, ``attn_config.kv_n_heads``, ... differ between architectures and multimodal
wrappers keep them in ``text_config``). Instead :func:`probe_model` builds the caches mlx-lm
itself would use (``mlx_lm.models.cache.make_prompt_cache``), runs one forward pass of a few
tokens through them with ``scaled_dot_product_attention`` instrumented, and reads per cache:
the K and V widths and head count of what was written, the kind (full or sliding window, from
``RotatingKVCache.max_size``) and the dtype the model computes in (the dtype of the keys it
wrote; a quantized model's packed ``uint32`` weights never decide it). Cache kinds the paged
path cannot hold and layers that write K/V without attending through
``scaled_dot_product_attention`` are refused here with an :class:`UnsupportedModelError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import mlx.core as mx

from mlxpa.loader.errors import UnsupportedModelError, model_type_of
from mlxpa.worker.patches import model_modules

# Token ids of the probe forward (small ids exist in every vocabulary).
PROBE_TOKENS = (2, 7, 1, 8, 2, 8)


@dataclass(frozen=True, slots=True)
class CacheGeometry:
    """One mlx-lm cache entry (one attention layer, or one loop of it).

    Attributes:
        kv_heads: K/V heads written per token (0: the entry is never written).
        k_dim: Width of one key head.
        v_dim: Width of one value head (may differ from ``k_dim``, e.g. MLA).
        window: Sliding window in tokens, or None for full attention.
        gathered: The layer attends with K/V of another shape than it caches (latent
            attention, MLA: keys and values computed from the cached latent; or K/V heads
            repeated in the model), so the paged path hands it the gathered context.
        state_size: For a recurrent-state entry (``ArraysCache``: SSM, convolution, linear
            attention), its number of state arrays (no pool; the state store holds it);
            0 for a K/V entry.
        state_shapes: Per state array, the shape of one request's (``[1, ...]``) and its
            dtype, as mlx-lm's forward left it (None: an array it never set).
    """

    kv_heads: int
    k_dim: int
    v_dim: int
    window: int | None = None
    gathered: bool = False
    state_size: int = 0
    state_shapes: tuple[tuple[tuple[int, ...], mx.Dtype] | None, ...] = ()

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.kv_heads, self.k_dim, self.v_dim


@dataclass(frozen=True, slots=True)
class ModelGeometry:
    """What :func:`probe_model` learned.

    Attributes:
        model_type: Architecture name.
        caches: One entry per cache mlx-lm makes for the model, in the model's order.
        dtype: The compute dtype (of the keys the model writes).
        array_mask: Whether a layer passed an ``mx.array`` as the attention mask on the
            probe (the paged path builds its own masks; the load check decides).
        layout: mlx-lm's cache list in entry indices: an int per plain cache, a tuple of
            entries per ``CacheList`` (a layer keeping several caches: a convolution state
            plus K/V, two attention blocks); None when every position is one entry.
        logits_width: Columns of the probe's logits (the vocabulary the head scores).
    """

    model_type: str
    caches: list[CacheGeometry]
    dtype: mx.Dtype
    array_mask: bool = False
    layout: list[int | tuple[int, ...]] | None = None
    logits_width: int = 0

    @property
    def windows(self) -> list[int | None]:
        return [c.window for c in self.caches]

    @property
    def gathered(self) -> list[bool]:
        return [c.gathered for c in self.caches]

    @property
    def has_kv(self) -> bool:
        """Whether any entry holds K/V (False: a pure state-space model)."""
        return any(c.kv_heads for c in self.caches)

    @property
    def recurrent(self) -> list[int]:
        """Indices of the recurrent-state entries."""
        return [i for i, c in enumerate(self.caches) if c.state_size]


@dataclass
class _Calls:
    attended: set[int] = field(default_factory=set)
    derived: set[int] = field(default_factory=set)
    array_mask: bool = False


@contextmanager
def _instrumented(model, calls: _Calls) -> Iterator[bool]:
    """Wrap each model module's ``scaled_dot_product_attention`` to record which caches
    attend through it; yields whether any module binds it."""
    swapped = []
    for module in model_modules(model):
        original = getattr(module, "scaled_dot_product_attention", None)
        if original is None:
            continue

        def recording(queries, keys, values, cache=None, *args, _orig=original, **kwargs):
            calls.attended.add(id(cache))
            stored = getattr(cache, "keys", None)
            if isinstance(stored, mx.array) and (stored.shape[1], stored.shape[3]) != (
                    keys.shape[1], keys.shape[3]):
                calls.derived.add(id(cache))
            calls.array_mask |= isinstance(kwargs.get("mask"), mx.array)
            return _orig(queries, keys, values, cache, *args, **kwargs)

        swapped.append((module, original))
        module.scaled_dot_product_attention = recording
    try:
        yield bool(swapped)
    finally:
        for module, original in swapped:
            module.scaled_dot_product_attention = original


def _cache_kind(cache, index: int) -> int | None:
    """The window of a supported cache (None: full attention); raises the refusal reason
    as ``ValueError`` for any other kind."""
    from mlx_lm.models import cache as c

    if isinstance(cache, c.RotatingKVCache):
        if cache.keep:
            raise ValueError(f"cache {index} keeps {cache.keep} sink tokens in its window "
                             "(RotatingKVCache keep > 0)")
        return cache.max_size
    if type(cache) is c.KVCache or type(cache) is c.ArraysCache:
        return None
    why = {c.CacheList: "a CacheList inside a CacheList",
           c.ChunkedKVCache: "chunked attention (ChunkedKVCache)",
           c.QuantizedKVCache: "a quantized KV cache (QuantizedKVCache)"}
    for kind, reason in why.items():
        if isinstance(cache, kind):
            raise ValueError(f"cache {index}: {reason}")
    raise ValueError(f"cache {index} is a {type(cache).__name__}, not a KVCache or "
                     "RotatingKVCache")


def cache_entries(caches: list) -> tuple[list, list[int | tuple[int, ...]] | None]:
    """mlx-lm's caches as entries (each ``CacheList`` opened one level) and the layout that
    rebuilds the list from entry indices (None when there is no ``CacheList``)."""
    from mlx_lm.models.cache import CacheList

    leaves, layout = [], []
    for c in caches:
        if isinstance(c, CacheList):
            layout.append(tuple(range(len(leaves), len(leaves) + len(c.caches))))
            leaves.extend(c.caches)
        else:
            layout.append(len(leaves))
            leaves.append(c)
    return leaves, (layout if len(leaves) != len(caches) or any(
        isinstance(e, tuple) for e in layout) else None)


def reference_logits(model, tokens: list[int], caches: list | None = None,
                     ) -> tuple[mx.array, list]:
    """mlx-lm's own forward of one prompt with fresh caches (``caches``: mlx-lm's caches to
    use, default ``make_prompt_cache(model)``): ``[len(tokens), vocab]`` float32 logits and
    the caches (for a following decode step)."""
    from mlx_lm.models.cache import make_prompt_cache

    caches = make_prompt_cache(model) if caches is None else caches
    out = model(mx.array([tokens]), cache=caches)
    return out[0].astype(mx.float32), caches


def probe_model(model, evaluate: bool = True) -> ModelGeometry:
    """Learn the model's cache geometry and compute dtype from one forward pass of
    :data:`PROBE_TOKENS` through mlx-lm's own caches (``evaluate`` False: the pass is only
    traced, never run; shapes and dtypes are known from the graph, so a lazily loaded
    model's weights are never read, for ``mlxpa plan``).

    Raises:
        UnsupportedModelError: A cache kind other than ``KVCache`` / ``RotatingKVCache``,
            mlx-lm's own forward failing, no module binding ``scaled_dot_product_attention``,
            a layer that writes K/V but attends outside
            ``scaled_dot_product_attention``, or no layer writing K/V at all.
    """
    from mlx_lm.models.cache import make_prompt_cache

    name = model_type_of(model)
    try:
        caches = make_prompt_cache(model)
        leaves, layout = cache_entries(caches)
        windows = [_cache_kind(c, i) for i, c in enumerate(leaves)]
    except (ValueError, AttributeError, TypeError) as e:
        raise UnsupportedModelError(name, str(e)) from None
    calls = _Calls()
    stateful = all(isinstance(getattr(c, "cache", None), list) for c in leaves)
    with _instrumented(model, calls) as binds:
        if not binds and not stateful:
            raise UnsupportedModelError(name, "its attention does not go through mlx-lm's "
                                        "scaled_dot_product_attention")
        try:
            logits = model(mx.array([PROBE_TOKENS]), cache=caches)
            if evaluate:
                mx.eval(logits)
        except Exception as e:  # noqa: BLE001 - any failure of the probe is a refusal
            raise UnsupportedModelError(
                name, f"mlx-lm's own forward pass fails: {type(e).__name__}: {e}") from None
    geometry, dtype = [], None
    for i, (cache, window) in enumerate(zip(leaves, windows)):
        keys, values = getattr(cache, "keys", None), getattr(cache, "values", None)
        if isinstance(getattr(cache, "cache", None), list):  # ArraysCache: recurrent state
            shapes = tuple(None if a is None else (tuple(a.shape), a.dtype)
                           for a in cache.cache)
            geometry.append(CacheGeometry(0, 0, 0, None, state_size=len(cache.cache),
                                          state_shapes=shapes))
            continue
        if keys is None:
            geometry.append(CacheGeometry(0, 0, 0, window))
            continue
        if id(cache) not in calls.attended:
            raise UnsupportedModelError(
                name, f"cache {i} is written but its layer computes attention outside "
                "scaled_dot_product_attention (block-sparse attention, a sparse-attention indexer: "
                "the paged path would silently differ)")
        geometry.append(CacheGeometry(keys.shape[1], keys.shape[3], values.shape[3], window,
                                      id(cache) in calls.derived))
        dtype = dtype or keys.dtype
    if dtype is None and stateful:  # no K/V: the dtype of the first floating state
        dtype = next((a.dtype for c in leaves for a in c.cache
                      if a is not None and mx.issubdtype(a.dtype, mx.floating)), None)
    if dtype is None:
        raise UnsupportedModelError(name, "no layer writes K/V or a recurrent state")
    return ModelGeometry(name, geometry, dtype, calls.array_mask, layout, logits.shape[-1])
