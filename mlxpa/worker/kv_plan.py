"""The KV memory of a plan (``mlxpa plan --kv-cache-dtype``): bytes per block in each storage,
what the planned blocks take, how many blocks the ``--kv-memory`` budget holds.

The model's cache geometry comes from the same probe as the engine's
(:func:`mlxpa.worker.model_probe.probe_model`), traced on a lazily loaded model: the forward
pass is never run, so no weight is read (a folder without weights plans too; its compute dtype
is then float32).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxpa.config import KV_CACHE_DTYPES, EngineConfig


@dataclass(frozen=True, slots=True)
class KVPlan:
    """Per-block KV memory of one model, in every ``--kv-cache-dtype``.

    Attributes:
        kv_cache_dtype: The chosen storage.
        block_size: Tokens per block.
        block_bytes: Bytes of one block (all layers, K and V) per ``--kv-cache-dtype``.
        storage: The chosen storage in words (as the KV pool line of ``mlxpa run``).
        budget_blocks: Blocks the memory budget (``--kv-memory``, or the default) holds in the
            chosen storage, null block excluded.
    """

    kv_cache_dtype: str
    block_size: int
    block_bytes: dict[str, int]
    storage: str
    budget_blocks: int

    def lines(self, blocks_without: int, blocks_with: int) -> list[str]:
        """The plan's KV lines for ``blocks_without`` / ``blocks_with`` sharing."""
        chosen, auto = self.block_bytes[self.kv_cache_dtype], self.block_bytes["auto"]
        others = ", ".join(f"{d} {b / self.block_size:,.0f}" for d, b in self.block_bytes.items()
                           if d != self.kv_cache_dtype)
        return [f"KV cache {self.storage}; bytes per token in the others: {others}",
                f"KV memory of the blocks: {_mib(blocks_with * chosen)} with sharing, "
                f"{_mib(blocks_without * chosen)} without"
                + (f" ({_mib(blocks_with * auto)} and {_mib(blocks_without * auto)} in auto)"
                   if self.kv_cache_dtype != "auto" else ""),
                f"the KV budget holds {self.budget_blocks:,} blocks "
                f"({self.budget_blocks * self.block_size:,} tokens) in {self.kv_cache_dtype}"]

    def to_dict(self, blocks_without: int, blocks_with: int) -> dict:
        chosen = self.block_bytes[self.kv_cache_dtype]
        return {"kv_cache_dtype": self.kv_cache_dtype, "storage": self.storage,
                "block_bytes": dict(self.block_bytes),
                "bytes_with_sharing": blocks_with * chosen,
                "bytes_without_sharing": blocks_without * chosen,
                "budget_blocks": self.budget_blocks}


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def plan_kv(config: EngineConfig) -> KVPlan:
    """The KV memory plan of ``config.model`` without running it: bytes per block in every
    KV cache dtype for ``config.block_size``, ``config.dtype`` and ``config.kv_group_size``,
    the blocks ``config``'s budget holds in ``config.kv_cache_dtype``.

    Raises:
        FileNotFoundError, ValueError: The model cannot be found or read.
        UnsupportedModelError: The engine would refuse the model.
    """
    import mlx.core as mx
    from mlx_lm.utils import load_model

    from mlxpa.config import kv_budget_bytes
    from mlxpa.core.kv_sizing import num_kv_blocks
    from mlxpa.kernels.device import on_cpu
    from mlxpa.loader.models import resolve_model
    from mlxpa.worker.kv_storage import kv_storage
    from mlxpa.worker.model_probe import probe_model

    # Lazy and not strict: no weight is read, and a folder without weights (a tokenizer and
    # config only, enough for the rest of the plan) still gives the shapes.
    model, _ = load_model(resolve_model(config.model, config.revision), lazy=True,
                          strict=False)
    dtype = "float32" if config.dtype == "auto" and on_cpu() else config.dtype
    if dtype != "auto":
        model.set_dtype(getattr(mx, dtype))
    geometry = probe_model(model, evaluate=False)
    storages = {d: kv_storage(geometry, d, config.kv_group_size) for d in KV_CACHE_DTYPES}
    sizes = {d: s.block_bytes(config.block_size) for d, s in storages.items()}
    chosen = config.kv_cache_dtype
    return KVPlan(chosen, config.block_size, sizes, storages[chosen].describe(),
                  num_kv_blocks(kv_budget_bytes(config), sizes[chosen]) - 1)
