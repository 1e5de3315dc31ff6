"""The replica of :func:`mlxpa.ray.build_processor`: Arrow batches of dataset rows in, the
same rows with their results out. A row's request id is its id (its position in the batch when
it has none), as in ``mlxpa run``; a later row of a batch that repeats an id gets an error."""

from __future__ import annotations

import json
from typing import Any

from mlxpa.batch.requests import RowRequest, to_request
from mlxpa.config import EngineConfig
from mlxpa.data.reader_options import RowSpec
from mlxpa.data.resume import id_key
from mlxpa.data.rows import parse_row
from mlxpa.inputs import InputProcessor
from mlxpa.ray.replica import ReplicaEngine
from mlxpa.sampling_params import SamplingParams

SOURCE = "<dataset>"


class RowReplica(ReplicaEngine):
    """Runs a batch of dataset rows (mlxpa input rows; see :func:`build_processor`).

    Args:
        config: Engine configuration (the model loads once per actor).
        defaults: Sampling parameters for fields a row does not set.
        drop: Columns removed from the output rows (the prefix sort key).
    """

    def __init__(self, config: EngineConfig, defaults: SamplingParams,
                 drop: tuple[str, ...] = ()) -> None:
        super().__init__(config)
        self.defaults, self.drop = defaults, drop
        self.spec = RowSpec(SOURCE, unit="row")
        self.processor = InputProcessor(self.engine.tokenizer)  # the engine checks the rest

    def __call__(self, batch: Any) -> Any:
        """``batch``: a ``pyarrow.Table`` of rows; returns a table with one row per sample."""
        import pyarrow as pa

        records = batch.to_pylist()
        rows, failed, first = [], {}, {}
        for i, obj in enumerate(records):
            row = parse_row({k: v for k, v in obj.items() if k not in self.drop}, i, None,
                            self.spec)
            seen = first.setdefault(id_key(row.id), i)
            req = row.error or (f"duplicate id {json.dumps(row.id)} (first at row {seen})"
                                if seen != i else to_request(row, self.defaults, self.processor))
            if isinstance(req, str):
                failed[i] = req if row.error else f"{SOURCE} id {row.id!r}: {req}"
            else:
                rows.append(RowRequest(row, req))
        outs, _ = self.run(rows)
        rows = []
        for i, obj in enumerate(records):
            base = {k: v for k, v in obj.items() if k not in self.drop}
            if i in failed:
                rows.append({**base, **_result(None, failed[i])})
                continue
            for out in outs[i]:
                rows.append({**base, **_result(out, out.error)})
        return pa.Table.from_pylist(rows)


def _result(out: Any, error: str | None) -> dict[str, Any]:
    """A sample's result columns: :data:`mlxpa.data.schema.CORE_COLUMNS` but ``id`` (the
    row's own columns hold it), and ``sample_index``."""
    if out is None or error is not None:
        return {"text": None, "finish_reason": "error",
                "prompt_tokens": out.num_prompt_tokens if out is not None else None,
                "completion_tokens": 0, "cached_tokens": 0,
                "sample_index": out.sample_index if out is not None else 0, "error": error}
    return {"text": out.text, "finish_reason": out.finish_reason,
            "prompt_tokens": out.num_prompt_tokens, "completion_tokens": len(out.token_ids),
            "cached_tokens": out.num_cached_tokens, "sample_index": out.sample_index,
            "error": None}
