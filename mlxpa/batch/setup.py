"""Build the engine for a known input: load the model, size the KV pool to the requests that
will run, report.

The pool takes ``min(budget, what the requests can use)`` blocks
(:mod:`mlxpa.core.kv_sizing`), so a small job does not hold the whole ``--kv-memory`` budget
(15% of memory by default). The requests are pass 2's first window, read and tokenized before
the model loads (no pass of its own); when more rows follow, the pool takes the budget.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

from rich.console import Console

from mlxpa.config import EngineConfig
from mlxpa.core.kv_sizing import kv_blocks_needed
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest


def build_engine(config: EngineConfig, first: list[EngineRequest], more: bool, *,
                 constrained: bool, console: Console, verbose: bool,
                 tokenizer=None) -> LLMEngine:
    """Load ``config.model`` and build an engine whose KV pool fits the requests to run.

    Args:
        config: Engine configuration; ``kv_blocks_needed`` is filled in here (unless
            ``num_blocks`` fixes the pool).
        first: The requests of pass 2's first window (rows over the context left out).
        more: Rows follow the window (the pool then takes the whole budget).
        constrained: Some request has a grammar (llguidance's tokenizer is built while the
            weights load).
        console: Where the pool line goes.
        verbose: Print the pool line.
        tokenizer: The model's tokenizer, already loaded (None: loaded with the model).

    Returns:
        The engine.

    Raises:
        FileNotFoundError, ValueError: As :func:`mlxpa.loader.models.load_model`.
    """
    from mlxpa.loader.models import load_model
    from mlxpa.structured.matchers import start_grammar_tokenizer
    from mlxpa.worker.kv_budget import kv_budget_bytes

    model, tokenizer, _ = load_model(config.model, config.dtype,
                                     start_grammar_tokenizer if constrained else None,
                                     revision=config.revision, adapter_path=config.adapter_path,
                                     keep_quantized=config.keep_quantized,
                                     kv_bytes=kv_budget_bytes(config), tokenizer=tokenizer)
    lengths = ((len(r.prompt_token_ids), r.sampling_params.max_tokens, r.sampling_params.n)
               for r in first)
    engine = LLMEngine(sized_config(config, model, lengths, more), model, tokenizer)
    r = engine.runner
    if verbose:
        mib = r.block_bytes / 2**20
        console.print(f"KV pool: {r.num_blocks - 1} blocks ({(r.num_blocks - 1) * mib:,.0f} "
                      f"MiB), what these rows can use; budget {r.budget_blocks - 1} blocks "
                      f"({(r.budget_blocks - 1) * mib / 1024:.2f} GiB, --kv-memory); "
                      f"{r.kv_storage.describe()}",
                      markup=False, highlight=False, soft_wrap=True)
    if constrained:
        _join_grammar_tokenizer(engine, console, verbose)
    return engine


def sized_config(config: EngineConfig, model, lengths: Iterable[tuple[int, int, int]],
                 more: bool = False) -> EngineConfig:
    """``config`` with the pool sized to ``lengths``.

    Args:
        config: Engine configuration (returned as it is when ``num_blocks`` fixes the pool).
        model: The loaded mlx-lm model (its block size in bytes sets the budget in blocks).
        lengths: ``(prompt_tokens, max_tokens, n)`` of each request that will run.
        more: Requests beyond ``lengths`` follow, of unknown need: the pool takes the budget.

    Returns:
        The configuration with ``kv_blocks_needed`` set.
    """
    from mlxpa.worker.kv_budget import kv_budget_blocks, model_block_bytes

    if config.num_blocks is not None or more:
        return config
    budget = kv_budget_blocks(model_block_bytes(model, config.block_size, config.kv_cache_dtype,
                                                config.kv_group_size), config)
    need = kv_blocks_needed(lengths, config.block_size, budget, config.max_model_len)
    return dataclasses.replace(config, kv_blocks_needed=need)


def _join_grammar_tokenizer(engine: LLMEngine, console: Console, verbose: bool) -> None:
    """Wait for the grammar tokenizer before the first step, saying so when it is not ready."""
    start = time.perf_counter()

    def say(vocab_size: int) -> None:
        console.print(f"building the grammar tokenizer (llguidance, {vocab_size:,} tokens) ...",
                      markup=False, highlight=False, soft_wrap=True)

    if engine.prepare(say if verbose else None) and verbose:
        console.print(f"grammar tokenizer built ({time.perf_counter() - start:.1f} s more "
                      "after the model loaded)", markup=False, highlight=False)
