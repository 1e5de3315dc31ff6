"""Build the engine for a known input: load the model, size the KV pool to the rows, report.

The pool takes ``min(budget, what the rows can use)`` blocks (:mod:`mlxpa.core.kv_sizing`),
so a small job does not hold the whole ``--kv-memory`` budget (15% of memory by default).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator

from rich.console import Console

from mlxpa.config import EngineConfig, SamplingParams
from mlxpa.core.kv_sizing import kv_blocks_needed
from mlxpa.data import Row
from mlxpa.data.resume import id_key
from mlxpa.data.validate import Validation
from mlxpa.engine import LLMEngine
from mlxpa.prompts import prompt_token_ids


def build_engine(config: EngineConfig, rows: Iterable[Row], validation: Validation,
                 defaults: SamplingParams, console: Console, verbose: bool) -> LLMEngine:
    """Load ``config.model`` and build an engine whose KV pool fits the rows left to run.

    Args:
        config: Engine configuration; ``kv_blocks_needed`` is filled in here (unless
            ``num_blocks`` fixes the pool).
        rows: The input rows (read again here, tokenized until the need reaches the budget).
        validation: Pass 1's result (rows with problems and ids already done are left out).
        defaults: Sampling parameters for fields a row does not set.
        console: Where the pool line goes.
        verbose: Print the pool line.

    Returns:
        The engine.

    Raises:
        FileNotFoundError, ValueError: As :func:`mlxpa.loader.models.load_model`.
    """
    from mlxpa.loader.models import load_model
    from mlxpa.worker.model_runner import kv_budget_blocks, model_block_bytes

    model, tokenizer, _ = load_model(config.model, config.dtype,
                                     _start_grammar_tokenizer if validation.constrained else None)
    if config.num_blocks is None:
        budget = kv_budget_blocks(model_block_bytes(model, config.block_size,
                                                    config.kv_cache_dtype,
                                                    config.kv_group_size), config)
        need = kv_blocks_needed(_lengths(rows, validation, defaults, tokenizer),
                                config.block_size, budget, config.max_model_len)
        config = dataclasses.replace(config, kv_blocks_needed=need)
    engine = LLMEngine(config, model, tokenizer)
    r = engine.runner
    if verbose:
        mib = r.block_bytes / 2**20
        console.print(f"KV pool: {r.num_blocks - 1} blocks ({(r.num_blocks - 1) * mib:,.0f} "
                      f"MiB), what these rows can use; budget {r.budget_blocks - 1} blocks "
                      f"({(r.budget_blocks - 1) * mib / 1024:.2f} GiB, --kv-memory); "
                      f"{r.kv_storage.describe()}",
                      markup=False, highlight=False, soft_wrap=True)
    if validation.constrained:
        _join_grammar_tokenizer(engine, console, verbose)
    return engine


def _start_grammar_tokenizer(tokenizer, config: dict) -> None:
    """Start llguidance's tokenizer build (seconds for a large vocabulary) in the
    background, keyed as the engine's :class:`~mlxpa.worker.structured.Grammars` asks."""
    from mlxpa.loader.models import vocab_size_of
    from mlxpa.worker.structured import start_ll_tokenizer

    vocab = vocab_size_of(config)
    if vocab is not None:
        start_ll_tokenizer(tokenizer._tokenizer, vocab, sorted(tokenizer.eos_token_ids))


def _join_grammar_tokenizer(engine: LLMEngine, console: Console, verbose: bool) -> None:
    """Wait for the grammar tokenizer before the first step, saying so when it is not ready."""
    start = time.perf_counter()
    say = verbose and not engine.grammars.tokenizer_ready()
    if say:
        console.print(f"building the grammar tokenizer (llguidance, "
                      f"{engine.grammars.vocab_size:,} tokens) ...", markup=False,
                      highlight=False, soft_wrap=True)
    engine.grammars.prepare()
    if say:
        console.print(f"grammar tokenizer built ({time.perf_counter() - start:.1f} s more "
                      "after the model loaded)", markup=False, highlight=False)


def _lengths(rows: Iterable[Row], validation: Validation, defaults: SamplingParams,
             tokenizer) -> Iterator[tuple[int, int, int]]:
    """``(prompt_tokens, max_tokens, n)`` of each row that will run."""
    for row in rows:
        if (row.error or row.index in validation.row_problems
                or (row.id is not None and id_key(row.id) in validation.done)):
            continue
        try:
            params = dataclasses.replace(defaults, **row.params)
            yield len(prompt_token_ids(row, tokenizer)), params.max_tokens, params.n
        except ValueError:  # an error row at run time: no blocks
            continue

