"""``mlxpa run``: every row of an input file through the engine, results in input order."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from mlxpa.cli.annotation import (
    CalibrationOpt,
    GoldColumnOpt,
    PermuteLabelsOpt,
    QuestionsOpt,
    annotation_inputs,
    check_annotation,
    read_calibration,
)
from mlxpa.cli.options import (
    ENGINE_FLAGS,
    POOL_FLAGS,
    BlasOpt,
    ChatTemplateOpt,
    IdColumnOpt,
    InputFormat,
    InputFormatOpt,
    MessagesColumnOpt,
    Order,
    OutputFormat,
    PromptColumnOpt,
    SplitSpecialOpt,
    SystemOpt,
    engine_config,
    engine_options,
    fail,
    flag_message,
    input_options,
    read_chat_template,
    sampling_defaults,
    sampling_options,
    text_option,
)
from mlxpa.config import EngineConfig
from mlxpa.data.reader_options import InputOptions
from mlxpa.sampling_params import SamplingParams

if TYPE_CHECKING:
    from mlxpa.batch.run import RunOptions
    from mlxpa.ray.options import RayOptions

# "\b" keeps click from re-wrapping the example lines.
RUN_EXAMPLES = """\b
Examples:
  mlxpa run examples/prompts.jsonl -o out.jsonl
  mlxpa run prompts.parquet -o out.parquet --max-tokens 64 \\
      --temperature 0.7 --seed 1
  mlxpa run batch_input.jsonl -o batch_output.jsonl    # OpenAI Batch
  mlxpa run data.csv -o out.jsonl --prompt-column question
  mlxpa run prompts.jsonl -o out.jsonl --resume    # after Ctrl-C
  head -5 examples/prompts.jsonl | mlxpa run - | jq -r .text
"""

InputArg = Annotated[str, typer.Argument(
    help="Prompts: .jsonl, .json, .csv, .tsv, .txt, .parquet, a datasets folder, or -.")]
OutputOpt = Annotated[str, typer.Option(
    "--output", "-o", help="Results: .jsonl or .parquet, or - (stdout, JSONL). An existing "
    "file is refused unless --overwrite or --resume.")]
OutputFormatOpt = Annotated[OutputFormat, typer.Option(
    help="mlxpa (a row per sample) or openai (Batch API output lines; the default for auto "
    "when every input line is an OpenAI Batch request and the output is JSONL).")]
KeepColumnsOpt = Annotated[list[str] | None, typer.Option(
    help="Input fields to copy into every output row (repeatable or comma-separated).")]
SkipInvalidOpt = Annotated[bool, typer.Option(
    "--skip-invalid", help="Write an error row for each invalid row and run the rest "
    "(default: list the first 20 problems and stop before loading the model).")]
UnorderedOpt = Annotated[bool, typer.Option(
    "--unordered", help="Write rows as they finish, not in input order.")]
ResumeOpt = Annotated[bool, typer.Option(
    "--resume", help="Keep the output's rows (skip their ids), run the rest, then put "
    "all rows in input order; a torn last line is cut off.")]
OrderOpt = Annotated[Order, typer.Option(
    help="Admission order: prefix (each window of 4096 rows read is ordered so rows sharing a "
    "prefix run together) or input. Output order is not affected.")]
MetricsJsonOpt = text_option(None, "Write the final statistics as JSON here.")
OverwriteOpt = Annotated[bool, typer.Option(
    "--overwrite", help="Replace an existing output file.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or report.")]
ChoiceOpt = text_option("A,B,..", "Default: one of these labels, scored (+ choice_probs, "
                        "choice_logprobs), spaces kept: ' yes, no'.")
JsonSchemaOpt = text_option("PATH", "Default: JSON valid under this schema file.")
RegexOpt = text_option("RE", "Default: text matching this regex.")
GrammarOpt = text_option("PATH", "Default: text in this Lark or GBNF grammar.")

RayOpt = Annotated[bool, typer.Option(
    "--ray", help="Run on Ray replicas (pip install 'mlxpa[ray]'); rows sharing a prefix go "
    "to the same replica.")]
RayAddressOpt = text_option(None, "Ray cluster to join (auto: the one `ray start --head` "
                            "started; default: a local Ray); implies --ray.")
NumReplicasOpt = Annotated[int, typer.Option(
    help="Engine replicas with --ray (each loads the model once).")]


@engine_options(*(f for f in ENGINE_FLAGS if f not in POOL_FLAGS))
@sampling_options()
def run(
    input: InputArg, output: OutputOpt = "-",
    engine: dict | None = None,  # the engine options (ENGINE_FLAGS but POOL_FLAGS) stand here
    sampling: dict | None = None,  # the sampling defaults (SAMPLING_FLAGS; a row's win)
    # constraint defaults
    choice: ChoiceOpt = None, json_schema: JsonSchemaOpt = None, regex: RegexOpt = None,
    grammar: GrammarOpt = None,
    # annotation: questions over each row's document
    questions: QuestionsOpt = None, gold_column: GoldColumnOpt = None,
    calibration: CalibrationOpt = None, permute_labels: PermuteLabelsOpt = False,
    # input
    system: SystemOpt = None, chat_template: ChatTemplateOpt = None,
    split_special_tokens: SplitSpecialOpt = False,
    input_format: InputFormatOpt = InputFormat.auto,
    prompt_column: PromptColumnOpt = "prompt", messages_column: MessagesColumnOpt = "messages",
    id_column: IdColumnOpt = "id", keep_columns: KeepColumnsOpt = None,
    skip_invalid: SkipInvalidOpt = False,
    # output
    output_format: OutputFormatOpt = OutputFormat.auto, unordered: UnorderedOpt = False,
    resume: ResumeOpt = False, overwrite: OverwriteOpt = False, order: OrderOpt = Order.prefix,
    metrics_json: MetricsJsonOpt = None, quiet: QuietOpt = False, blas: BlasOpt = "auto",
    ray: RayOpt = False, ray_address: RayAddressOpt = None, num_replicas: NumReplicasOpt = 1,
) -> None:
    """Generate a completion for every row of INPUT; one result row per input row, in order.

    Ctrl-C writes every finished row, prints the command that resumes the run and exits 130."""
    from mlxpa.batch.run import RunOptions
    from mlxpa.structured.fields import cli_constraint
    try:
        config = engine_config(engine or {})
        defaults = sampling_defaults(sampling or {},
                                     cli_constraint(choice, json_schema, regex, grammar))
        inputs = annotation_inputs(
            input_options(input_format, prompt_column, messages_column, id_column, system,
                          keep_columns, split_special_tokens, read_chat_template(chat_template)),
            questions, gold_column, permute_labels)
        check_annotation(inputs, calibration, ray=ray or ray_address is not None,
                         constrained=defaults.structured_outputs is not None,
                         output_format=output_format.value)
        options = RunOptions(output_format.value, order.value, not unordered, skip_invalid,
                             resume, metrics_json, show_progress=not quiet,
                             calibration=read_calibration(calibration, inputs))
        _check_overwrite(input, output, allowed=resume or overwrite)
        ray_options = _ray_options(ray or ray_address is not None, ray_address, num_replicas)
    except ValueError as e:
        raise typer.BadParameter(flag_message(e)) from None
    _run_command(input, output, config, defaults, inputs, options, ray_options)


def _pipe_closed(console, num_written: int | None) -> None:
    """The reader of stdout went away (``| head``): say so in one line, exit 141 (128 +
    SIGPIPE, as a Unix tool killed by the signal exits)."""
    import contextlib
    import os

    with contextlib.suppress(OSError, ValueError):  # no flush error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    done = "" if num_written is None else f" after {num_written} result row(s)"
    console.print(f"error: the output pipe was closed{done}; stopping", style="red",
                  markup=False, highlight=False)
    raise typer.Exit(141)


def _ray_options(ray: bool, address: str | None, num_replicas: int):
    """``RayOptions`` for ``--ray`` (None: a local run; Ray is imported only when asked)."""
    if not ray:
        return None
    from mlxpa.ray.options import RayOptions

    return RayOptions(address, num_replicas)


def _check_overwrite(input: str, output: str, allowed: bool) -> None:
    """A forgotten ``--resume`` must not destroy finished work: an existing output file
    (not the input, which ``run_file`` refuses with its own message) needs ``--overwrite``.

    Raises:
        ValueError: ``output`` is an existing file and ``allowed`` is false.
    """
    import os

    if output == "-" or allowed or not os.path.isfile(output):
        return
    if input != "-" and os.path.exists(input) and os.path.samefile(input, output):
        return
    raise ValueError(f"{output} exists; pass --resume to continue it or --overwrite to "
                     "replace it")


def _run_command(input: str, output: str, config: EngineConfig, defaults: SamplingParams,
                 inputs: InputOptions, options: RunOptions,
                 ray_options: RayOptions | None = None) -> None:
    """Run the file; map failures to exit statuses (2: bad input or option, 1: other errors,
    130: interrupted, with the command that resumes)."""
    from rich.console import Console

    from mlxpa.batch.run import OptionError, run_file
    from mlxpa.cli.signals import catch_sigint
    from mlxpa.data import InputError
    from mlxpa.data.resume import resume_hint

    console = Console(stderr=True, soft_wrap=True)  # result lines rich prints stay whole
    if options.show_progress:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    with catch_sigint() as interrupted:
        try:
            if ray_options is not None:
                from mlxpa.ray.run import run_file_ray

                run_file_ray(input, output, config, defaults, options, ray_options,
                             inputs=inputs, console=console, should_stop=interrupted.should_stop)
            else:
                run_file(input, output, config, defaults, options, inputs=inputs,
                         console=console, should_stop=interrupted.should_stop)
        except OptionError as e:
            raise typer.BadParameter(str(e)) from None
        except InputError as e:
            fail(console, e, 2)
        except BrokenPipeError as e:
            _pipe_closed(console, getattr(e, "num_written", None))
        except (OSError, ValueError) as e:
            fail(console, e, 1)
        except KeyboardInterrupt:
            interrupted.set()
    if interrupted.is_set():
        console.print(resume_hint(input, output, sys.argv), markup=False, highlight=False,
                      soft_wrap=True)
        raise typer.Exit(130)
