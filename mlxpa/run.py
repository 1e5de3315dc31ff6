"""``mlxpa run`` as a library call: rows in, results out in input order, statistics back.

Data flow (one way): ``read_rows`` → validation and tokenization → ``LLMEngine.generate`` →
``ResultWriter`` (input order, flushed as rows finish) while the progress bar reads the
engine's counters. A row that cannot run gets a record with an ``error`` and the run goes on.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import defaultdict

from rich.console import Console

from mlxpa.config import EngineConfig, SamplingParams
from mlxpa.data import ResultWriter, Row, read_rows
from mlxpa.engine import LLMEngine, PromptInput
from mlxpa.metrics import Stats, summarize
from mlxpa.prefix_order import prefix_order
from mlxpa.progress import RunProgress, summary_table
from mlxpa.prompts import prompt_token_ids
from mlxpa.request import RequestOutput


def error_record(row: Row, message: str, prompt_tokens: int | None = None) -> dict:
    """The output record of a row that could not run."""
    return {"id": row.id, "text": None, "finish_reason": "error",
            "prompt_tokens": prompt_tokens, "completion_tokens": 0, "cached_tokens": 0,
            "error": message}


def result_record(row: Row, out: RequestOutput) -> dict:
    """The output record of a finished request."""
    if out.error is not None:
        return error_record(row, f"{_where(row)}: {out.error}", out.num_prompt_tokens)
    return {"id": row.id, "text": out.text, "finish_reason": out.finish_reason,
            "prompt_tokens": out.num_prompt_tokens, "completion_tokens": len(out.token_ids),
            "cached_tokens": out.num_cached_tokens}


def _where(row: Row) -> str:
    return f"row {row.index}" + (f" (line {row.line})" if row.line is not None else "")


def _requests(rows: list[Row], tokenizer, defaults: SamplingParams,
              writer: ResultWriter) -> list[PromptInput]:
    """Tokenize every valid row; rows that cannot run get their error record now."""
    items = []
    for row in rows:
        if row.error is not None:
            writer.add(row.index, error_record(row, row.error))
            continue
        try:
            params = dataclasses.replace(defaults, **row.params)
            ids = prompt_token_ids(row, tokenizer)
        except ValueError as e:
            writer.add(row.index, error_record(row, f"{_where(row)}: {e}"))
            continue
        items.append(PromptInput(row.index, ids, params))
    return items


def _ordered(items: list[PromptInput], order: str, block_size: int) -> list[PromptInput]:
    if order == "input":
        return items
    if order != "prefix":
        raise ValueError(f"order must be 'prefix' or 'input', got {order!r}")
    return [items[i] for i in prefix_order([it.prompt_token_ids for it in items], block_size)]


def run_file(source: str, output: str, config: EngineConfig, defaults: SamplingParams, *,
             fmt: str | None = None, prompt_column: str = "prompt",
             messages_column: str = "messages", id_column: str = "id",
             order: str = "prefix", metrics_json: str | None = None,
             console: Console | None = None, show_progress: bool = True,
             engine: LLMEngine | None = None) -> Stats:
    """Run every row of ``source`` and write one result per row to ``output``.

    Args:
        source: Input path or ``"-"`` (stdin).
        output: Output path (``.jsonl`` or ``.parquet``) or ``"-"`` (stdout, JSONL).
        config: Engine configuration (used when ``engine`` is None).
        defaults: Sampling parameters for fields a row does not set.
        fmt: Input format (None: by extension).
        prompt_column: Field of the text prompt.
        messages_column: Field of the chat messages.
        id_column: Field of the row id.
        order: ``prefix`` admits rows in depth-first order of a radix tree over all prompts
            (rows sharing a prefix run together); ``input`` keeps the file order. Output is in
            input order either way.
        metrics_json: Where to write the final statistics as JSON.
        console: Where progress and the report go (default: stderr).
        show_progress: Draw the progress bar and final report.
        engine: A ready engine (tests); None builds one from ``config``.

    Returns:
        The run's statistics.

    Raises:
        InputError: The input is malformed (raised before the model loads).
        ValueError: A sampling default is invalid.
    """
    console = console or Console(stderr=True)
    rows = list(read_rows(source, fmt=fmt, prompt_column=prompt_column,
                          messages_column=messages_column, id_column=id_column))
    engine = engine or LLMEngine(config)
    engine.counters.start_time = time.perf_counter()
    by_index = {row.index: row for row in rows}
    with ResultWriter(output) as writer, RunProgress(len(rows), engine.counters, console,
                                                     show_progress) as progress:
        items = _ordered(_requests(rows, engine.tokenizer, defaults, writer), order,
                         engine.config.block_size)
        num_samples = {it.request_id: it.params.n for it in items}
        samples: dict[int, list[dict]] = defaultdict(list)
        progress.advance(len(rows) - len(items))  # rows that failed validation
        for out in engine.generate(items):
            row, n = by_index[out.request_id], num_samples[out.request_id]
            record = result_record(row, out)
            if n == 1:
                writer.add(row.index, record)
                progress.advance()
                continue
            group = samples[row.index]
            group.append({**record, "sample_index": out.sample_index})
            if len(group) == n:
                writer.add(row.index, sorted(samples.pop(row.index),
                                             key=lambda r: r["sample_index"]))
                progress.advance()
    stats = summarize(engine.counters)
    if show_progress:
        console.print(summary_table(stats, engine.runner.num_blocks - 1))
    if metrics_json:
        with open(metrics_json, "w") as f:
            json.dump(stats.to_dict(), f, indent=2)
    return stats
