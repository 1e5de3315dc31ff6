"""Options shared by the ``mlxpa`` commands (Typer annotations, choices as enums), the builders
that turn them into library settings, and the error exit.

Only light modules are imported here (configuration, the input settings), so ``mlxpa --help``
stays instant.
"""

from __future__ import annotations

import enum
from typing import Annotated, NoReturn

import typer
from typer.core import TyperCommand

from mlxpa.config import KERNELS, KV_CACHE_DTYPES, EngineConfig
from mlxpa.core.prefix_order import ORDERS
from mlxpa.data.inputs import FORMATS, InputOptions
from mlxpa.data.records import OUTPUT_FORMATS


def choices(name: str, values: tuple[str, ...]) -> type[enum.Enum]:
    """A ``str`` enum of ``values`` (Typer checks the choice and lists it in ``--help``)."""
    return enum.Enum(name, {v.replace("-", "_"): v for v in values}, type=str)


Kernel = choices("Kernel", KERNELS)
KVCacheDtype = choices("KVCacheDtype", KV_CACHE_DTYPES)
Order = choices("Order", ORDERS)
InputFormat = choices("InputFormat", ("auto", *FORMATS))
OutputFormat = choices("OutputFormat", OUTPUT_FORMATS)

ModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", metavar="MODEL", help="MLX folder, Hub repo id (downloaded unless "
    "cached) or .gguf; default Gemma 3 270M.")]
RevisionOpt = Annotated[str | None, typer.Option(
    help="Branch, tag or commit of a repo id --model.")]
AdapterPathOpt = Annotated[str | None, typer.Option(
    "--adapter-path", metavar="DIR", help="mlx-lm LoRA/DoRA adapter folder.")]
KeepQuantizedOpt = Annotated[bool, typer.Option(
    "--keep-quantized", help="CPU: keep quantized weights packed.")]
BlockSizeOpt = Annotated[int, typer.Option(help="Tokens per KV block.")]
KVMemoryOpt = Annotated[float | None, typer.Option(
    "--kv-memory", help="Most memory for the KV pool in GiB (default: 15% of memory, at most "
    "4); the pool takes only what the input can use.")]
BenchKVMemoryOpt = Annotated[float | None, typer.Option(
    "--kv-memory", help="Most memory for mlxpa's KV pool in GiB (default: 15% of memory, at "
    "most 4); the pool takes only what the workload can use.")]
MaxNumSeqsOpt = Annotated[int, typer.Option(help="Most requests decoding at once.")]
MaxBatchedOpt = Annotated[int, typer.Option(
    help="Token budget of one step (prefill chunks + decodes); longer prompts are chunked.")]
MaxModelLenOpt = Annotated[int | None, typer.Option(
    help="Longest prompt + completion in tokens (default: the model's context).")]
KernelOpt = Annotated[Kernel, typer.Option(help="Paged attention backend.")]
KVCacheDtypeOpt = Annotated[KVCacheDtype, typer.Option(
    help="KV cache storage: auto (the compute dtype) or quantized per token as mlx-lm does "
    "(k8v4: 8-bit K, 4-bit V).")]
KVGroupSizeOpt = Annotated[int, typer.Option(
    help="Quantized KV: elements per scale and bias (32, 64, 128).")]
CascadeAttentionOpt = Annotated[bool, typer.Option(
    "--cascade-attention/--no-cascade-attention",
    help="Rows decoding after a shared prefix read it once per step where that pays.")]
BlasOpt = Annotated[str, typer.Option(
    metavar="[auto|system|bundled]", help="Linux CPU BLAS (auto: an installed OpenBLAS/MKL).")]

# How to read the input: the same options for `run` and `plan`.
InputFormatOpt = Annotated[InputFormat, typer.Option(
    help="auto (by extension; a folder is a datasets folder), or hf for the datasets "
    "library.")]
PromptColumnOpt = Annotated[str, typer.Option(help="Field with the text prompt.")]
MessagesColumnOpt = Annotated[str, typer.Option(help="Field with chat messages.")]
IdColumnOpt = Annotated[str, typer.Option(help="Field with the row id.")]
SystemOpt = Annotated[str | None, typer.Option(
    help="System message: a system turn before chat messages (unless they start with one), "
    "or text before a text prompt.")]
SplitSpecialOpt = Annotated[bool, typer.Option(
    "--split-special-tokens", help="Control-token text (<eos>, ...) in prompts is plain text, "
    "as in chat messages.")]


def input_options(input_format: enum.Enum, prompt_column: str, messages_column: str,
                  id_column: str, system: str | None,
                  keep_columns: list[str] | None = None,
                  split_special_tokens: bool = False) -> InputOptions:
    """The reader settings of the input options (``--keep-columns`` repeatable or
    comma-separated).

    Raises:
        ValueError: A kept column named like an output field.
    """
    keep = tuple(c.strip() for k in keep_columns or () for c in k.split(",") if c.strip())
    fmt = None if input_format.value == "auto" else input_format.value
    return InputOptions(fmt, prompt_column, messages_column, id_column, system, keep,
                        split_special_tokens)


def engine_config(model: str | None, block_size: int, kv_memory: float | None,
                  max_num_seqs: int, max_num_batched_tokens: int, kernel: enum.Enum,
                  **more: object) -> EngineConfig:
    """The :class:`~mlxpa.config.EngineConfig` of the engine options ``run`` and ``bench``
    share; ``more`` are further ``EngineConfig`` fields.

    Raises:
        ValueError: A field out of range (named by its option: ``--kv-memory``), or an
            ``--adapter-path`` that is not an mlx-lm adapter folder (checked here, before any
            input is read).
    """
    try:
        config = EngineConfig(model=model, block_size=block_size, kv_memory_gib=kv_memory,
                              max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens,
                              kernel=kernel.value, **more)
    except ValueError as e:
        field = str(e).split(" ", 1)[0]
        flag = _FLAGS.get(field, "--" + field.replace("_", "-"))
        raise ValueError(f"{flag}{str(e)[len(field):]}") from None
    if config.adapter_path is not None:
        from mlxpa.loader.adapters import check_adapter_path

        try:
            check_adapter_path(config.adapter_path)
        except FileNotFoundError as e:
            raise ValueError(str(e)) from None
    return config


_FLAGS = {"kv_memory_gib": "--kv-memory", "enable_prefix_caching": "--prefix-caching",
          "enable_cascade_attention": "--cascade-attention",
          "stop_token_ids": "--stop-token-id", "include_stop_str_in_output": "--include-stop-str"}


def flag_message(error: ValueError) -> str:
    """The message of a configuration field's error (:class:`~mlxpa.config.FieldError`) with
    the field named by its option: ``top_p must be ...`` -> ``--top-p must be ...``; any other
    error's message as it is."""
    text = str(error)
    field = getattr(error, "field", None)
    if not isinstance(field, str) or not text.startswith(field):
        return text
    return _FLAGS.get(field, "--" + field.replace("_", "-")) + text[len(field):]


# click's UsageError (Typer vendors click, so it is not click's own class).
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class OneLineError(UsageError):
    """A usage error shown as one ``error:`` line on stderr (exit status 2), instead of
    click's usage block (``Usage: ...``, ``Try ... --help``, a blank line, ``Error: ...``)."""

    def show(self, file=None) -> None:
        typer.echo(f"error: {self.message}", err=True)


def one_line(error: Exception) -> OneLineError:
    """click's usage ``error`` as one line naming the option: a value click could not convert
    reads ``--temperature: Input should be a valid number, ...``; a command's own check
    (``BadParameter`` without a parameter) keeps its message."""
    if isinstance(error, OneLineError):
        return error
    param = getattr(error, "param", None)
    message = getattr(error, "message", None)
    if isinstance(error, typer.BadParameter) and param is not None and message:
        longs = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
        name = max(longs, key=len) if longs else param.human_readable_name
        text = f"{name}: {message.removeprefix('Value error, ')}"
    elif isinstance(error, typer.BadParameter) and message and error.param_hint is None:
        text = message
    else:
        text = error.format_message()
    return OneLineError(text)


_METAVARS = {"int": "N", "float": "X", "list[int]": "N"}
_PATH_OPTIONS = {"output", "metrics_json", "json_path", "plot", "input"}


class PlainUsageCommand(TyperCommand):
    """A Typer command whose help reads as click's at 80 columns: usage ``INPUT``, not
    ``{INPUT}``; an argument shows no ``<str>`` type; an option's value is ``N``, ``X``,
    ``PATH``, ``TEXT`` or ``[a|b]`` (its choices), not ``<int>``; flags show none. Its usage
    errors (a bad value, an unknown option, a missing argument) are one line
    (:func:`one_line`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:  # Typer vendors click: its classes are not click's
            if p.param_type_name == "argument":
                p.metavar = p.metavar or p.name.upper()
                p.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
            elif p.param_type_name == "option" and not p.is_flag and p.metavar is None:
                shown = p.display_type(None) or ""
                if "|" in shown:
                    p.metavar = f"[{shown.strip('<>')}]"
                elif p.name in _PATH_OPTIONS:
                    p.metavar = "PATH"
                else:
                    p.metavar = _METAVARS.get(p.bare_type(), "TEXT")

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except UsageError as e:
            raise one_line(e) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UsageError as e:
            raise one_line(e) from None

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p
                for p in super().collect_usage_pieces(ctx)]


def fail(console, error: Exception, code: int) -> NoReturn:
    """Print ``error`` on stderr unwrapped and without markup, then exit with ``code``."""
    console.print(f"error: {error}", style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code) from None
