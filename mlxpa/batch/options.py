"""How a file run runs (:class:`RunOptions`, the ``mlxpa run`` options beyond the engine,
sampling and input settings) and the checks of where it writes, made before anything is read."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from mlxpa.core.prefix_order import ORDERS, PREFIX_WINDOW
from mlxpa.data import STDIN
from mlxpa.data._files import check_output_path

if TYPE_CHECKING:
    from mlxpa.annotation.calibration import Calibration


class OptionError(ValueError):
    """A bad option of a run, found before any work (the command line's usage error)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunOptions:
    """How :func:`~mlxpa.batch.run.run_file` runs a file: the ``mlxpa run`` options beyond the
    engine, sampling and input settings.

    Attributes:
        output_fmt: ``mlxpa`` rows, ``openai`` Batch output lines (JSONL only), or ``auto``
            (what a resumed output holds, else ``openai`` when every input row is an OpenAI
            Batch line and the output is JSONL, else ``mlxpa``).
        order: ``prefix`` admits each window of ``window`` rows in depth-first order of a
            radix tree over its prompts (rows sharing a prefix run together); ``input`` keeps
            the file order.
        ordered: Write results in input order (else as they finish).
        skip_invalid: Write an error result for each invalid row and run the rest (else any
            invalid row stops the run before the model loads).
        resume: Keep the output's rows, skip their ids, and add the rest; with ``ordered``,
            a run that is not stopped then rewrites the whole output in input order.
        metrics_json: Where to write the final statistics as JSON.
        show_progress: Draw the progress bar and final report.
        window: Rows per prefix-ordering window; the first window also sizes the KV pool.
        calibration: Applied to the answers of rows asked questions (``--calibration``);
            None: raw probabilities.
        name_output: Say where the rows went (False: an output nobody asked for, as
            ``mlxpa calibrate``'s scores without ``--scores-output``).

    Raises:
        OptionError: ``order`` is not one of :data:`~mlxpa.core.prefix_order.ORDERS`.
    """

    output_fmt: str = "auto"
    order: str = "prefix"
    ordered: bool = True
    skip_invalid: bool = False
    resume: bool = False
    metrics_json: str | None = None
    show_progress: bool = True
    window: int = PREFIX_WINDOW
    calibration: Calibration | None = None
    name_output: bool = True

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise OptionError(f"order must be one of {', '.join(ORDERS)}, got {self.order!r}")


def check_targets(source: str, output: str, options: RunOptions) -> None:
    """Check where a run writes, before anything is read.

    Raises:
        OptionError: ``--resume`` to stdout; an output that is the input file.
        ValueError: An output or ``metrics_json`` that is a folder or whose folder does not
            exist.
    """
    if options.resume and output == STDIN:
        raise OptionError("--resume needs an output file (-o PATH), not stdout")
    if _same_file(source, output):
        raise OptionError(f"the output {output} is the input file; writing it would destroy "
                          "the input")
    for target in (output, options.metrics_json):
        if target is not None and target != STDIN:
            check_output_path(target)


def _same_file(a: str, b: str) -> bool:
    try:
        return a != STDIN and b != STDIN and os.path.samefile(a, b)
    except OSError:
        return False
