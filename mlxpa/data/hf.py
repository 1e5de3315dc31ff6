"""Hugging Face ``datasets`` inputs: a folder written by ``save_to_disk``, or local data files.

* A ``save_to_disk`` folder (``state.json`` / ``dataset_dict.json``) is opened with
  ``datasets.load_from_disk`` (a memory-mapped Arrow table) and read by batches. A
  ``DatasetDict`` with several splits asks for one split's folder (``data/test``).
* Any other folder, or a file read with ``--input-format hf`` (``.json``, ``.jsonl``,
  ``.csv``, ``.parquet``, ``.txt``, ``.arrow``), goes through ``datasets.load_dataset`` in
  streaming mode (no Arrow cache is written).
* A name that is not a local path (a hub dataset id such as ``tatsu-lab/alpaca``) is an
  :class:`~mlxpa.data.reader_options.InputError`: mlxpa runs offline and does not download datasets.

Rows are 0-based row numbers ("row" in messages), as for Parquet.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from mlxpa.data.reader_options import InputError, RowSpec, check_columns

_BUILDERS = {".json": "json", ".jsonl": "json", ".ndjson": "json", ".csv": "csv",
             ".tsv": "csv", ".parquet": "parquet", ".pq": "parquet", ".txt": "text",
             ".arrow": "arrow"}
_BATCH_ROWS = 1024


def iter_hf_records(source: str, spec: RowSpec) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(0-based row, record)`` for every row of a ``datasets`` input.

    Args:
        source: A ``save_to_disk`` folder, a folder of data files, or a data file.
        spec: The reader's settings (columns, display name).

    Raises:
        InputError: At call time for a path that does not exist (a hub dataset name) or
            cannot be loaded; while iterating when there is no prompt or messages column.
    """
    if not os.path.exists(source):
        raise InputError(
            "not a local file or folder; a Hugging Face hub dataset cannot be downloaded here "
            "(mlxpa runs offline). Save it on a machine with access: "
            f"datasets.load_dataset({source!r}, split='train').save_to_disk('folder'), "
            "then run on that folder", source=spec.source)
    try:
        import datasets
    except ImportError:  # pragma: no cover - a declared dependency
        raise InputError("the `datasets` package is not installed", source=spec.source) from None
    datasets.disable_progress_bars()
    ext = os.path.splitext(source)[1].lower()
    if os.path.isfile(source) and ext not in _BUILDERS:
        raise InputError(f"datasets cannot read {ext or 'files without an extension'!r}; use "
                         f"one of {', '.join(sorted(_BUILDERS))}", source=spec.source)
    try:
        if _is_saved(source):
            return _iter_saved(datasets.load_from_disk(source), source, spec)
        if os.path.isdir(source):
            ds = datasets.load_dataset(source, streaming=True)
        else:
            ds = datasets.load_dataset(_BUILDERS[ext], data_files=source, streaming=True)
    except (OSError, ValueError, datasets.exceptions.DatasetNotFoundError) as e:
        raise InputError(f"cannot load with datasets ({e})", source=spec.source) from None
    return _iter_streaming(_one_split(ds, source, spec), spec)


def _is_saved(path: str) -> bool:
    return os.path.isdir(path) and any(
        os.path.isfile(os.path.join(path, f)) for f in ("state.json", "dataset_dict.json"))


def _one_split(ds: Any, source: str, spec: RowSpec) -> Any:
    if not hasattr(ds, "keys"):  # a single split already
        return ds
    splits = list(ds.keys())
    if len(splits) == 1:
        return ds[splits[0]]
    raise InputError(f"has splits {', '.join(splits)}; give one split's folder, e.g. "
                     f"{os.path.join(source, splits[0])}", source=spec.source)


def _iter_saved(ds: Any, source: str, spec: RowSpec) -> Iterator[tuple[int, dict]]:
    ds = _one_split(ds, source, spec)
    ds = ds.select_columns(check_columns(list(ds.column_names), spec))
    row = 0
    for batch in ds.iter(batch_size=_BATCH_ROWS):
        names = list(batch)
        for values in zip(*(batch[n] for n in names)):
            yield row, dict(zip(names, values))
            row += 1


def _iter_streaming(ds: Any, spec: RowSpec) -> Iterator[tuple[int, dict]]:
    columns = None
    for row, obj in enumerate(ds):
        if columns is None:
            columns = set(check_columns(list(obj), spec))
        yield row, {k: v for k, v in obj.items() if k in columns}
