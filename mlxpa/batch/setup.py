"""Build the engine for a known input: load the model, size the KV pool to the requests that
will run, report.

The pool takes ``min(budget, what the requests can use)`` blocks
(:mod:`mlxpa.core.kv_sizing`), so a small job does not hold the whole ``--kv-memory`` budget
(15% of memory by default). The requests are pass 2's first window, read and tokenized before
the model loads (no pass of its own); when more rows follow, the pool takes the budget.
"""

from __future__ import annotations

import time

from rich.console import Console

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest


def build_engine(config: EngineConfig, first: list[EngineRequest], more: bool, *,
                 constrained: bool, console: Console, verbose: bool,
                 tokenizer=None) -> LLMEngine:
    """Load ``config.model`` and build an engine whose KV pool fits the requests to run.

    Args:
        config: Engine configuration.
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

    model, tokenizer, folder = load_model(
        config, on_tokenizer=start_grammar_tokenizer if constrained else None,
        tokenizer=tokenizer)
    work = None if more else [
        (len(r.prompt_token_ids), r.sampling_params.max_tokens, r.sampling_params.n)
        for r in first]
    engine = LLMEngine(config, model, tokenizer, expected_requests=work, model_folder=folder)
    r = engine.runner
    if verbose:
        pool, budget = r.num_blocks - 1, r.budget_blocks - 1
        what = ("the budget" if pool == budget and more
                else "what these rows can use")
        console.print(f"KV pool: {pool} blocks ({_size(pool * r.block_bytes)}), {what}; "
                      f"budget {budget} blocks ({_size(budget * r.block_bytes)}, "
                      f"--kv-memory); {r.kv_storage.describe()}",
                      markup=False, highlight=False, soft_wrap=True)
    if constrained:
        _join_grammar_tokenizer(engine, console, verbose)
    return engine


def _size(num_bytes: int) -> str:
    """``73 MiB`` or ``3.53 GiB``: one unit per size, the same for the pool and its budget."""
    if num_bytes < 2**30:
        return f"{num_bytes / 2**20:,.0f} MiB"
    return f"{num_bytes / 2**30:.2f} GiB"


def _join_grammar_tokenizer(engine: LLMEngine, console: Console, verbose: bool) -> None:
    """Wait for the grammar tokenizer before the first step, saying so when it is not ready."""
    start = time.perf_counter()

    def say(vocab_size: int) -> None:
        console.print(f"building the grammar tokenizer (llguidance, {vocab_size:,} tokens) ...",
                      markup=False, highlight=False, soft_wrap=True)

    if engine.prepare(say if verbose else None) and verbose:
        console.print(f"grammar tokenizer built ({time.perf_counter() - start:.1f} s more "
                      "after the model loaded)", markup=False, highlight=False)
