"""``mlxpa plan``: what prefix sharing will save on an input, and the KV memory it takes,
without running the model.

Makes every row's request as ``mlxpa run`` does (tokenizer only, no weights), orders the
requests the way ``mlxpa run --order prefix`` admits them, and replays that order through a
simulated radix tree (:class:`RadixCache` with no pool, no eviction) to predict each row's
prefix cache hit exactly as the engine computes it: whole blocks, capped at ``len(prompt) - 1``,
only between rows of the same ``cache_salt``. With a disk KV tier (``--kv-cache-dir``), each
row's hit then continues over the blocks a run would read from disk
(:func:`mlxpa.core.kv_disk.disk_prefix_end`: the engine's hash chain under the namespace a run
of this model and storage writes, the files' headers peeked), and the blocks join the
simulated tree, as a run's do: hits are reported by tier.
The KV memory (:func:`plan_kv`) comes from the engine's own probe of the model's caches
(:func:`mlxpa.worker.model_probe.probe_model`), traced on a lazily loaded model: no weight is
read, so a folder without weights plans too (its compute dtype is then float32).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from rich.table import Table

from mlxpa.batch.requests import rows_to_requests
from mlxpa.batch.source import Source
from mlxpa.config import KV_CACHE_DTYPES, EngineConfig
from mlxpa.core.kv_cache_groups import KVCacheLayout
from mlxpa.core.prefix_order import prefix_order, shared_prefix_stats
from mlxpa.core.radix_cache import RadixCache
from mlxpa.data.validate import Validation
from mlxpa.inputs import InputProcessor, over_context
from mlxpa.sampling_params import SamplingParams
from mlxpa.utils import cdiv

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    from mlxpa.worker.kv_storage import KVStorage

# A row's hit continued on disk: (its tokens as looked up, its cache_salt, the blocks of its
# hit in memory) -> the end of its hit in blocks.
DiskLookup = Callable[[Sequence[int], "str | None", int], int]

MAX_LISTED = 20  # rows over the context named in a plan


@dataclass(frozen=True, slots=True)
class SharedPrefixReport:
    """One shared prefix: its length, how many rows share it, its first row's id and text."""

    num_tokens: int
    num_rows: int
    first_row_id: str | int
    preview: str


@dataclass(frozen=True, slots=True)
class Plan:
    """Predicted effect of prefix sharing on one input.

    Attributes:
        rows: Rows that can run (invalid rows are counted in ``invalid_rows``).
        invalid_rows: Rows with a validation error.
        over_context_rows: Rows whose prompt leaves no room for an output token in the
            context (``run`` writes an error row for each); not in the figures.
        prompt_tokens: Sum of prompt lengths.
        computed_prompt_tokens: Prompt tokens left to compute after prefix cache hits.
        predicted_hit_rate: ``1 - computed / prompt`` tokens.
        kv_blocks_without_sharing: Blocks to hold every sample of every row at once (prompt +
            ``max_tokens`` each, clamped to the context as ``run`` clamps it; ``n`` samples per
            row) with no sharing.
        kv_blocks_with_sharing: The same with full prompt blocks shared (each distinct one
            counted once, also across a row's ``n`` samples).
        block_size: Tokens per block used for the figures.
        shared_prefixes: Longest shared prefixes, longest first.
        over_context: The first :data:`MAX_LISTED` rows over the context, named like
            ``run``'s problems (``file line N: prompt has T tokens; ...``).
        request_blocks: Per row, ``(blocks of prompt + output, n)`` (what a sliding-window
            group's share is counted from; not in :meth:`to_dict`).
        disk_cached_prompt_tokens: Of the prompt tokens cached (``prompt - computed``), those
            a run would read from the disk KV tier; None without ``--kv-cache-dir``.
        kv_cache_dir: The disk tier's folder looked in, or None.
    """

    rows: int
    invalid_rows: int
    over_context_rows: int
    prompt_tokens: int
    computed_prompt_tokens: int
    predicted_hit_rate: float
    kv_blocks_without_sharing: int
    kv_blocks_with_sharing: int
    block_size: int
    shared_prefixes: list[SharedPrefixReport]
    over_context: list[str]
    request_blocks: list[tuple[int, int]] = field(default_factory=list)
    disk_cached_prompt_tokens: int | None = None
    kv_cache_dir: str | None = None

    @property
    def cached_prompt_tokens(self) -> int:
        """Prompt tokens the prefix cache serves, every tier."""
        return self.prompt_tokens - self.computed_prompt_tokens

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["request_blocks"]
        out["cached_prompt_tokens"] = self.cached_prompt_tokens
        if self.disk_cached_prompt_tokens is not None:
            out["memory_cached_prompt_tokens"] = (self.cached_prompt_tokens
                                                  - self.disk_cached_prompt_tokens)
        return out


def plan_token_lists(token_lists: list[list[int]], max_tokens: list[int],
                     block_size: int, n: list[int] | None = None,
                     salts: list[str | None] | None = None) -> tuple[int, int, int, int]:
    """``(prompt_tokens, computed_prompt_tokens, blocks_without, blocks_with)`` for prompts
    admitted in prefix order with ``max_tokens`` outputs (already clamped to the context) and
    ``n`` samples each (None: one), each under its ``cache_salt`` in ``salts`` (None: all
    unsalted; rows of two salts share nothing)."""
    return _simulate(token_lists, max_tokens, block_size, n, salts)[:4]


def _simulate(token_lists: list[list[int]], max_tokens: list[int], block_size: int,
              n: list[int] | None = None, salts: list[str | None] | None = None,
              disk: DiskLookup | None = None) -> tuple[int, int, int, int, int]:
    """:func:`plan_token_lists`, and the prompt tokens of the hits read from disk (each row's
    hit continued by ``disk``; 0 without)."""
    n = n or [1] * len(token_lists)
    salts = salts or [None] * len(token_lists)
    tree = RadixCache(None, block_size)
    computed = from_disk = 0
    for i in prefix_order(token_lists, block_size, salts):
        ids = token_lists[i]
        looked_up = ids[:len(ids) - 1]
        hit = tree.match_prefix(looked_up, salts[i]).num_tokens
        if disk is not None:
            end = disk(looked_up, salts[i], hit // block_size) * block_size
            from_disk += end - hit
            hit = end
        computed += len(ids) - hit
        tree.insert(ids, cache_salt=salts[i])
    without = sum(k * cdiv(len(t) + m, block_size)
                  for t, m, k in zip(token_lists, max_tokens, n))
    tails = sum(k * (cdiv(len(t) + m, block_size) - len(t) // block_size)
                for t, m, k in zip(token_lists, max_tokens, n))
    return (sum(map(len, token_lists)), computed, without, tree.total_blocks + tails,
            from_disk)


def plan_file(src: Source, validation: Validation, tokenizer: TokenizerWrapper,
              defaults: SamplingParams, *, block_size: int = 16, top_k: int = 5,
              max_model_len: int | None = None, disk: DiskLookup | None = None,
              kv_cache_dir: str | None = None) -> Plan:
    """Predict prefix sharing for every row of ``src``: its requests as ``mlxpa run`` makes
    them (:func:`~mlxpa.batch.requests.rows_to_requests`, the same merge and tokenization).

    Args:
        src: The input (a ``system`` message in its settings changes which blocks are
            shared).
        validation: Pass 1's result (its invalid rows are counted, not planned).
        tokenizer: The model's mlx-lm ``TokenizerWrapper``.
        defaults: Sampling parameters of rows that do not set theirs (``max_tokens``: the
            output tokens of such a row).
        block_size: Tokens per KV block.
        top_k: Shared prefixes to report.
        max_model_len: The context in tokens (prompt + output); each row's output is clamped
            to it, and a prompt that leaves no room is counted over the context (None: no cap).
        disk: Continues a row's hit over the disk KV tier's blocks (None: no tier).
        kv_cache_dir: The tier's folder (reported; with ``disk``).

    Raises:
        InputError: The input is malformed.
    """
    rows, ids, caps, ns, salts, bad, over = [], [], [], [], [], 0, []
    processor = InputProcessor(tokenizer, split_special_tokens=src.inputs.split_special_tokens)
    for rr in rows_to_requests(src, validation, defaults, processor):
        if rr.request is None:
            bad += 1
            continue
        prompt, params = rr.request.prompt_token_ids, rr.request.sampling_params
        cap = params.max_tokens
        if max_model_len is not None:
            problem = over_context(len(prompt), max_model_len)
            if problem is not None:
                over.append(f"{src.place(rr.row)}: {problem}")
                continue
            cap = min(cap, max_model_len - len(prompt))
        rows.append(rr.row)
        ids.append(prompt)
        caps.append(cap)
        ns.append(params.n)
        salts.append(rr.request.cache_salt)
    return _plan(rows, ids, caps, ns, salts, bad, over, tokenizer, block_size, top_k, disk,
                 kv_cache_dir)


def _plan(rows, ids, caps, ns, salts, bad: int, over: list[str], tokenizer, block_size: int,
          top_k: int, disk: DiskLookup | None = None, kv_cache_dir: str | None = None) -> Plan:
    prompt, computed, without, with_sharing, from_disk = _simulate(ids, caps, block_size, ns,
                                                                   salts, disk)
    stats = shared_prefix_stats(ids, block_size, top_k, salts)
    shared = [SharedPrefixReport(s.num_tokens, s.num_rows, rows[s.first_row].id,
                                 tokenizer.decode(ids[s.first_row][:s.num_tokens])[:80])
              for s in stats.top_prefixes]
    return Plan(len(rows), bad, len(over), prompt, computed,
                1 - computed / prompt if prompt else 0.0, without, with_sharing, block_size,
                shared, over[:MAX_LISTED],
                [(cdiv(len(t) + m, block_size), k) for t, m, k in zip(ids, caps, ns)],
                from_disk if disk is not None else None, kv_cache_dir)


def plan_tables(plan: Plan, title: str) -> tuple[Table, Table]:
    """``mlxpa plan``'s report: the predicted figures, and the longest shared prefixes."""
    t = Table(title=title, show_header=False, box=None)
    skipped = f"{plan.invalid_rows} invalid" + (
        f", {plan.over_context_rows} over the context" if plan.over_context_rows else "")
    for k, v in [("rows", f"{plan.rows} (+{skipped})"),
                 ("prompt tokens", f"{plan.prompt_tokens}"),
                 ("tokens after sharing", f"{plan.computed_prompt_tokens}"),
                 *([("cached prompt tokens", f"{plan.cached_prompt_tokens} (memory "
                     f"{plan.cached_prompt_tokens - plan.disk_cached_prompt_tokens}, disk "
                     f"{plan.disk_cached_prompt_tokens})")]
                   if plan.disk_cached_prompt_tokens is not None else []),
                 ("predicted prefix cache hit rate", f"{plan.predicted_hit_rate:.1%}"),
                 ("KV blocks without sharing", f"{plan.kv_blocks_without_sharing}"),
                 ("KV blocks with sharing", f"{plan.kv_blocks_with_sharing}"),
                 ("block size", f"{plan.block_size}")]:
        t.add_row(f"[bold]{k}", v)
    s = Table(title="longest shared prefixes")
    for col in ("tokens", "rows", "first row", "starts with"):
        s.add_column(col)
    for sp in plan.shared_prefixes:
        s.add_row(str(sp.num_tokens), str(sp.num_rows), str(sp.first_row_id), repr(sp.preview))
    return t, s


@dataclass(frozen=True, slots=True)
class KVPlan:
    """Per-block KV memory of one model, in every ``--kv-cache-dtype``.

    Attributes:
        kv_cache_dtype: The chosen storage.
        block_size: Tokens per block.
        block_bytes: Bytes of one block (its layer slots, K and V) per ``--kv-cache-dtype``.
        storage: The chosen storage in words (as the KV pool line of ``mlxpa run``).
        budget_blocks: Blocks the memory budget (``--kv-memory``, or the default) holds in the
            chosen storage, null block excluded.
        layout: The model's KV cache groups.
        chunk: The most tokens a step computes for one request (``max_num_batched_tokens``).
        dtype: The compute dtype's name, as the engine's runner reports it.
        kv_storage: The chosen storage (:class:`~mlxpa.worker.kv_storage.KVStorage`).
        model_folder: The folder the model resolved to.
    """

    kv_cache_dtype: str
    block_size: int
    block_bytes: dict[str, int]
    storage: str
    budget_blocks: int
    layout: KVCacheLayout | None = None
    chunk: int = 2048
    dtype: str | None = None
    kv_storage: KVStorage | None = None
    model_folder: str | None = None

    def pool_blocks(self, plan: Plan) -> tuple[int, int]:
        """``(without, with)`` sharing: pool blocks over every KV cache group, each
        full-attention group a block per block of tokens (shared prompt blocks once, with
        sharing), each sliding-window group at most its window's per sample (never shared
        in this count)."""
        layout = self.layout
        if layout is None:
            return plan.kv_blocks_without_sharing, plan.kv_blocks_with_sharing
        full = sum(w is None for w in layout.windows)
        chunk = min(self.chunk, layout.max_chunk_tokens or self.chunk)
        windows = [layout.window_blocks(w, chunk) for w in layout.windows if w is not None]
        sliding = sum(k * min(n, wb) for n, k in plan.request_blocks for wb in windows)
        return (full * plan.kv_blocks_without_sharing + sliding,
                full * plan.kv_blocks_with_sharing + sliding)

    def lines(self, plan: Plan) -> list[str]:
        """The plan's KV lines."""
        without, with_sharing = self.pool_blocks(plan)
        chosen, auto = self.block_bytes[self.kv_cache_dtype], self.block_bytes["auto"]
        others = ", ".join(f"{d} {b:,}" for d, b in self.block_bytes.items()
                           if d != self.kv_cache_dtype)
        return [f"KV cache {self.storage}; {chosen:,} bytes per block ({self.block_size} "
                f"tokens), in the others: {others}",
                f"KV memory of the blocks: {_mib(with_sharing * chosen)} with sharing, "
                f"{_mib(without * chosen)} without"
                + (f" ({_mib(with_sharing * auto)} and {_mib(without * auto)} in auto)"
                   if self.kv_cache_dtype != "auto" else ""),
                f"the KV budget holds {self.budget_blocks:,} blocks "
                f"({self.budget_blocks * self.block_size:,} token slots) in "
                f"{self.kv_cache_dtype}"]

    def to_dict(self, plan: Plan) -> dict:
        without, with_sharing = self.pool_blocks(plan)
        chosen = self.block_bytes[self.kv_cache_dtype]
        return {"kv_cache_dtype": self.kv_cache_dtype, "storage": self.storage,
                "block_bytes": dict(self.block_bytes),
                "pool_blocks_with_sharing": with_sharing,
                "pool_blocks_without_sharing": without,
                "bytes_with_sharing": with_sharing * chosen,
                "bytes_without_sharing": without * chosen,
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
    folder = resolve_model(config.model, config.revision)
    model, _ = load_model(folder, lazy=True, strict=False)
    dtype = "float32" if config.dtype == "auto" and on_cpu() else config.dtype
    if dtype != "auto":
        model.set_dtype(getattr(mx, dtype))
    geometry = probe_model(model, evaluate=False)
    storages = {d: kv_storage(geometry, d, config.kv_group_size, config.block_size)
                for d in KV_CACHE_DTYPES}
    sizes = {d: s.block_bytes(config.block_size) for d, s in storages.items()}
    chosen = config.kv_cache_dtype
    return KVPlan(chosen, config.block_size, sizes, storages[chosen].describe(),
                  num_kv_blocks(kv_budget_bytes(config), sizes[chosen]) - 1,
                  storages[chosen].layout, config.max_num_batched_tokens, str(geometry.dtype),
                  storages[chosen], str(folder))


def disk_lookup(config: EngineConfig, kv: KVPlan) -> DiskLookup:
    """The disk KV tier's lookup for a plan (``config.kv_cache_dir``): the store a run of
    this model and storage would open (:func:`mlxpa.engine.disk_tier.existing_disk_store`)
    and :func:`~mlxpa.core.kv_disk.disk_prefix_end` over it; none found when the folder holds no
    block of that namespace, or the model has no K/V (no tier): then no hit continues.

    Raises:
        OSError: The model folder or the cache folder cannot be read.
    """
    from mlxpa.core.kv_disk import disk_prefix_end, supports_disk_tier
    from mlxpa.engine.disk_tier import existing_disk_store

    layout = kv.layout
    store = (existing_disk_store(config, kv.model_folder, kv.dtype, kv.kv_storage)
             if layout is not None and supports_disk_tier(layout) else None)
    if store is None:
        return lambda tokens, salt, start: start
    return lambda tokens, salt, start: disk_prefix_end(store, layout, tokens, salt, start)
