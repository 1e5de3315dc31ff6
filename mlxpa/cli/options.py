"""Options shared by the ``mlxpa`` commands (Typer annotations, choices as enums), the builders
that turn them into library settings, and the error exit.

Two tables make the options of the engine and of sampling, as vLLM generates its own from its
config classes: :data:`ENGINE_FLAGS` (an entry per :class:`~mlxpa.config.EngineConfig` field:
``--max-num-seqs``, ``--kv-cache-memory-bytes``; ``--kv-memory`` in GiB too) and
:data:`SAMPLING_FLAGS` (each :class:`~mlxpa.sampling_params.SamplingParams` request field with
an option, read from the field's own metadata: ``--temperature``, ``--stop-token-id``); types
and defaults are the fields'. Only light modules are imported here, so ``mlxpa --help`` stays
instant.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand, TyperGroup

from mlxpa.config import DTYPES, KERNELS, KV_CACHE_DTYPES, EngineConfig
from mlxpa.core.prefix_order import ORDERS
from mlxpa.data.reader_options import FORMATS, InputOptions
from mlxpa.data.records import OUTPUT_FORMATS
from mlxpa.messages import FieldError
from mlxpa.sampling_params import SamplingParams, StructuredOutput


def choices(name: str, values: tuple[str, ...]) -> type[enum.Enum]:
    """A ``str`` enum of ``values`` (Typer checks the choice and lists it in ``--help``)."""
    return enum.Enum(name, {v.replace("-", "_"): v for v in values}, type=str)


Order = choices("Order", ORDERS)
InputFormat = choices("InputFormat", ("auto", *FORMATS))
OutputFormat = choices("OutputFormat", OUTPUT_FORMATS)

BlasOpt = Annotated[str, typer.Option(
    metavar="[auto|system|bundled]", help="Linux CPU BLAS (auto: an installed OpenBLAS/MKL).")]

# How to read the input: the same options for `run` and `plan`.
InputFormatOpt = Annotated[InputFormat, typer.Option(
    help="auto (by extension; a folder is a datasets folder), or hf for the datasets "
    "library.")]
PromptColumnOpt = Annotated[str, typer.Option(help="Field with the text prompt.")]
MessagesColumnOpt = Annotated[str, typer.Option(help="Field with chat messages.")]
IdColumnOpt = Annotated[str, typer.Option(help="Field with the row id.")]
def text_option(metavar: str | None, help: str) -> Any:
    """An optional text option: ``Annotated[str | None, typer.Option(metavar=, help=)]``."""
    return Annotated[str | None, typer.Option(metavar=metavar, help=help)]


SystemOpt = Annotated[str | None, typer.Option(
    help="System message: a system turn before chat messages (unless they start with one), "
    "or text before a text prompt.")]
SplitSpecialOpt = Annotated[bool, typer.Option(
    "--split-special-tokens", help="Control-token text (<eos>, ...) in prompts is plain text, "
    "as in chat messages.")]
ChatTemplateOpt = Annotated[str | None, typer.Option(
    metavar="FILE|TEXT", show_default=False, help="Chat template: a Jinja file or text.")]


def read_chat_template(value: str | None) -> str | None:
    """The template text of ``--chat-template`` (vLLM's rule): a file's contents, or the
    value itself when it holds a template's braces or a line break.

    Raises:
        ValueError: A value that looks like a path but names no readable file.
    """
    if value is None:
        return None
    try:
        with open(value, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        if any(c in value for c in "{}\n"):
            return value
        raise ValueError(f"--chat-template {value}: {e.strerror or e} (give a Jinja template "
                         "file, or the template text itself)") from None


def input_options(input_format: enum.Enum, prompt_column: str, messages_column: str,
                  id_column: str, system: str | None,
                  keep_columns: list[str] | None = None,
                  split_special_tokens: bool = False,
                  chat_template: str | None = None) -> InputOptions:
    """The reader settings of the input options (``--keep-columns`` repeatable or
    comma-separated; ``chat_template``: the template's text).

    Raises:
        ValueError: A kept column named like an output field.
    """
    keep = tuple(c.strip() for k in keep_columns or () for c in k.split(",") if c.strip())
    fmt = None if input_format.value == "auto" else input_format.value
    return InputOptions(fmt, prompt_column, messages_column, id_column, system, keep,
                        split_special_tokens, chat_template=chat_template)


@dataclasses.dataclass(frozen=True, slots=True)
class EngineFlag:
    """How one :class:`~mlxpa.config.EngineConfig` field is spelled on the command line.

    Attributes:
        help: The option's help text.
        decls: Its names (default: ``--<field-name>``; a bool that defaults to True also gets
            ``--no-<field-name>``).
        choices: The values a ``str`` field takes (an enum in ``--help``).
        metavar: The value's name in ``--help`` (default: from its type).
        kind: The option's type where it is not the field's (``str | None``: a nested
            config's JSON text, which the config parses and checks).
    """

    help: str
    decls: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    kind: Any = None


# EngineConfig field -> its option. Types and defaults are the fields' own.
ENGINE_FLAGS: dict[str, EngineFlag] = {
    "model": EngineFlag("MLX folder, Hub repo id (downloaded unless cached) or .gguf; default "
                        "Gemma 3 270M.", ("--model", "-m"), metavar="MODEL"),
    "revision": EngineFlag("Branch, tag or commit of a repo id --model."),
    "adapter_path": EngineFlag("mlx-lm LoRA/DoRA adapter folder.", metavar="DIR"),
    "keep_quantized": EngineFlag("CPU: keep quantized weights packed."),
    "dtype": EngineFlag("Compute dtype (auto: float32 on the CPU).", choices=DTYPES),
    "seed": EngineFlag("Engine seed: a row without a seed field samples with a seed derived "
                       "from this and its id (its index when it has none; vLLM's "
                       "LLM(seed=...))."),
    "block_size": EngineFlag("Tokens per KV block."),
    "kv_cache_memory_bytes": EngineFlag(
        "Most memory for the KV pool in bytes (default: 15% of memory, at most 4 GiB); the "
        "pool takes only what the work can use.", metavar="N"),
    "kv_cache_dtype": EngineFlag("KV cache storage: auto (the compute dtype) or quantized per "
                                 "token as mlx-lm does (k8v4: 8-bit K, 4-bit V).",
                                 choices=KV_CACHE_DTYPES),
    "kv_group_size": EngineFlag("Quantized KV: elements per scale and bias (32, 64, 128)."),
    "kv_segment_bytes": EngineFlag(
        "The KV pool starts at one segment of N bytes and grows by segments up to the budget "
        "(default 64 MiB; 0: the whole budget at start).", metavar="N"),
    "kv_release_after": EngineFlag(
        "Seconds without work before the KV pool gives back its segments but one (negative: "
        "never).", metavar="SECONDS"),
    "max_num_seqs": EngineFlag("Most running requests."),
    "max_num_batched_tokens": EngineFlag("Token budget of one step (prefill chunks + "
                                         "decodes); longer prompts are chunked."),
    "max_model_len": EngineFlag("Longest prompt + completion in tokens (default: the model's "
                                "context)."),
    "enable_prefix_caching": EngineFlag("Share cached prompt prefixes across rows (radix "
                                        "tree)."),
    "kv_cache_dir": EngineFlag("Disk KV tier (auto: ~/.cache/mlxpa/kv).", metavar="DIR"),
    "kv_cache_disk_gb": EngineFlag("Its bound in GiB.", metavar="GB"),
    "disable_cascade_attn": EngineFlag("Turn off cascade attention."),
    "attention_backend": EngineFlag("Paged attention kernels.", choices=KERNELS),
    "speculative_config": EngineFlag("Draft-free speculation: vLLM's JSON object.",
                                     metavar="JSON", kind=str | None),
}
# What a flag must be where the API's words (its FieldError's) name a value no one can type.
_CLI_WANTED = {"kv_segment_bytes": "an integer >= 0 (0: the whole budget at start)"}
# The options of a KV pool that grows with the load and shrinks when idle: a server's and
# LLM's, not those of a command whose pool is sized to its known work (mlxpa run).
POOL_FLAGS = ("kv_segment_bytes", "kv_release_after")
# The GiB spelling of --kv-cache-memory-bytes (a parameter of every command that takes that).
KV_MEMORY = "kv_memory"
_KV_MEMORY_OPT = Annotated[float | None, typer.Option(
    "--kv-memory", metavar="X", help="--kv-cache-memory-bytes in GiB.")]
_FIELD_TYPES = typing.get_type_hints(EngineConfig)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineConfig)}


def _flag_parameter(name: str) -> inspect.Parameter:
    """The Typer parameter of ``ENGINE_FLAGS[name]``."""
    flag = ENGINE_FLAGS[name]
    kind, default = flag.kind or _FIELD_TYPES[name], _DEFAULTS[name]
    decls = flag.decls or ("--" + name.replace("_", "-"),)
    if kind is bool and default and not flag.decls:
        decls = (f"{decls[0]}/--no-{decls[0][2:]}",)
    if flag.choices is not None:
        kind = choices("".join(w.title() for w in name.split("_")), flag.choices)
        default = kind(default)
    option = typer.Option(*decls, help=flag.help, metavar=flag.metavar,
                          show_default=kind is not bool)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[kind, option])


def engine_options(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the engine options ``names`` (keys of :data:`ENGINE_FLAGS`, in ``--help`` order) to a
    Typer command, and ``--kv-memory`` with ``--kv-cache-memory-bytes``. The command takes
    them as one parameter, ``engine``: ``{name: value}`` (choices as their strings), for
    :func:`engine_config`; the options stand where ``engine`` stands in its signature."""
    added = []
    for name in names:
        added.append(_flag_parameter(name))
        if name == "kv_cache_memory_bytes":
            added.append(inspect.Parameter(KV_MEMORY, inspect.Parameter.KEYWORD_ONLY,
                                           default=None, annotation=_KV_MEMORY_OPT))

    def engine(values: dict[str, Any]) -> dict[str, Any]:
        return {k: v.value if isinstance(v, enum.Enum) else v for k, v in values.items()}

    return option_group("engine", added, engine)


def option_group(target: str, added: list[inspect.Parameter],
                 convert: Callable[[dict[str, Any]], Any] = dict,
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator that puts the options ``added`` into a Typer command's signature where its
    parameter ``target`` stands, and calls the command with ``target=convert({name:
    value})`` of them instead.

    Raises:
        ValueError: (when applied) The command has no parameter ``target``.
    """
    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)  # Typer passes keywords
               for p in inspect.signature(command, eval_str=True).parameters.values()]
        at = [p.name for p in own].index(target)
        params = [*own[:at], *added, *own[at + 1:]]

        @functools.wraps(command)
        def with_group(**kwargs: Any) -> Any:
            group = convert({p.name: kwargs.pop(p.name) for p in added})
            return command(**kwargs, **{target: group})

        with_group.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        with_group.__annotations__ = {p.name: p.annotation for p in params}
        return with_group

    return wrap


# SamplingParams field -> its option's metadata (help, names), for the fields that have one.
SAMPLING_FLAGS: dict[str, Any] = {f.name: f.metadata for f in dataclasses.fields(SamplingParams)
                                  if f.metadata.get("cli")}
_SAMPLING_TYPES = typing.get_type_hints(SamplingParams)
_SAMPLING_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SamplingParams)}


def _sampling_parameter(name: str) -> inspect.Parameter:
    """The Typer parameter of ``SAMPLING_FLAGS[name]``: a repeatable option for a tuple
    field, a flag for a bool."""
    meta, kind, default = SAMPLING_FLAGS[name], _SAMPLING_TYPES[name], _SAMPLING_DEFAULTS[name]
    if typing.get_origin(kind) is tuple:
        kind, default = list[typing.get_args(kind)[0]] | None, None
    decls = meta["decls"] or ("--" + name.replace("_", "-"),)
    option = typer.Option(*decls, help=meta["cli"], show_default=meta["show_default"])
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[kind, option])


def sampling_options(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the sampling options ``names`` (keys of :data:`SAMPLING_FLAGS`; all by default) to
    a Typer command, standing where its parameter ``sampling`` stands; the command gets them
    as ``sampling``: ``{field: value}``, for :func:`sampling_defaults`."""
    added = [_sampling_parameter(name) for name in names or SAMPLING_FLAGS]
    return option_group("sampling", added)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def unescape(value: str) -> str:
    """``value`` with the backslash escapes ``\\n``, ``\\t``, ``\\r`` and ``\\\\`` replaced
    (``--stop '\\n'`` in a shell passes the two characters; a stop string of them never
    matches what users mean); any other backslash stays as it is."""
    import re

    return re.sub(r"\\([ntr\\])", lambda m: _ESCAPES[m.group(1)], value)


def sampling_defaults(sampling: dict[str, Any],
                      structured_outputs: StructuredOutput | None = None) -> SamplingParams:
    """The run's default :class:`SamplingParams` of a command's sampling options (stop
    strings unescaped).

    Raises:
        FieldError, ValueError: A value out of range (:func:`flag_message` names its option).
    """
    values = {k: tuple(v or ()) if typing.get_origin(_SAMPLING_TYPES[k]) is tuple else v
              for k, v in sampling.items()}
    if "stop" in values:
        values["stop"] = tuple(unescape(s) for s in values["stop"])
    return SamplingParams(**values, structured_outputs=structured_outputs)


def checked_engine_config(engine: dict[str, Any] | None) -> EngineConfig:
    """:func:`engine_config`, its errors as a usage error (one line naming the flag, exit 2,
    before any input is read).

    Raises:
        typer.BadParameter: As :func:`engine_config`'s ``ValueError``.
    """
    try:
        return engine_config(engine or {})
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def engine_config(engine: dict[str, Any]) -> EngineConfig:
    """The :class:`~mlxpa.config.EngineConfig` of a command's engine options (the ``engine``
    of :func:`engine_options`).

    Raises:
        ValueError: A field out of range (named by its option: ``--max-num-seqs must be an
            integer >= 1, got 0``; a nested config's field after it:
            ``--speculative-config: method must be ...``), ``--kv-memory`` not > 0 or given with
            ``--kv-cache-memory-bytes``, or an ``--adapter-path`` that is not an mlx-lm
            adapter folder (checked here, before any input is read).
    """
    fields = dict(engine)
    gib = fields.pop(KV_MEMORY, None)
    if gib is not None:
        if fields.get("kv_cache_memory_bytes") is not None:
            raise ValueError("give one of --kv-memory (GiB) and --kv-cache-memory-bytes")
        if not gib > 0:
            raise ValueError(f"--kv-memory must be > 0, got {gib}")
        fields["kv_cache_memory_bytes"] = max(1, int(gib * 2**30))
    try:
        config = EngineConfig(**fields)
    except FieldError as e:
        top, dot, inner = e.field.partition(".")
        decls = ENGINE_FLAGS[top].decls if top in ENGINE_FLAGS else ()
        flag = (decls or ("--" + top.replace("_", "-"),))[0]
        rest = str(e)[len(e.field):]
        if not dot and top in _CLI_WANTED:  # the API's words name what a flag cannot take
            rest = rest.replace(e.wanted, _CLI_WANTED[top], 1)
        raise ValueError(f"{flag}{': ' + inner if dot else ''}{rest}") from None
    if config.adapter_path is not None:
        from mlxpa.loader.adapters import check_adapter_path

        try:
            check_adapter_path(config.adapter_path)
        except FileNotFoundError as e:
            raise ValueError(str(e)) from None
    return config


def engine_argv(engine: dict[str, Any], skip: tuple[str, ...] = ("model", "revision"),
                ) -> list[str]:
    """The flags that give another ``mlxpa`` command (``mlxpa serve``) the engine options of
    ``engine`` (the ``engine`` of :func:`engine_options`) that differ from their defaults;
    ``--kv-memory`` as given; the options ``skip`` names are left out."""
    argv: list[str] = []
    for name, value in engine.items():
        if name in skip or value is None:
            continue
        if name == KV_MEMORY:
            argv += ["--kv-memory", f"{value:g}"]
            continue
        if value == _DEFAULTS[name]:
            continue
        decl = (ENGINE_FLAGS[name].decls or ("--" + name.replace("_", "-"),))[0]
        if isinstance(value, bool):
            argv.append(decl if value else f"--no-{decl[2:]}")
        else:
            argv += [decl, str(value)]
    return argv


def flag_message(error: ValueError) -> str:
    """The message of a configuration field's error (:class:`~mlxpa.config.FieldError`) with
    the field named by its option: ``top_p must be ...`` -> ``--top-p must be ...``; any other
    error's message as it is."""
    text = str(error)
    field = getattr(error, "field", None)
    if not isinstance(field, str) or not text.startswith(field):
        return text
    decls = SAMPLING_FLAGS[field]["decls"] if field in SAMPLING_FLAGS else ()
    return (decls or ("--" + field.replace("_", "-"),))[0] + text[len(field):]


# click's UsageError (Typer vendors click, so it is not click's own class).
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class OneLineError(UsageError):
    """A usage error shown as one ``error:`` line on stderr (exit status 2), instead of
    click's usage block (``Usage: ...``, ``Try ... --help``, a blank line, ``Error: ...``)."""

    def show(self, file=None) -> None:
        typer.echo(f"error: {self.message}", err=True)


# Options of mlx-lm's and vLLM's commands that mlxpa spells otherwise, and what to give.
HABITS = {
    "--temp": "mlx-lm's flag; mlxpa spells it --temperature",
    "--prompt": "mlx-lm's one-prompt flag: mlxpa generate --prompt TEXT",
    "-p": "mlx-lm's one-prompt flag: mlxpa generate --prompt TEXT",
    "--system-prompt": "mlx-lm's flag; mlxpa spells it --system",
    "--max-kv-size": "mlx-lm's flag; mlxpa sizes the KV pool with --kv-memory GIB",
    "--gpu-memory-utilization": "vLLM's flag; mlxpa sizes the KV pool with --kv-memory GIB "
                                "or --kv-cache-memory-bytes",
    "--tensor-parallel-size": "vLLM's flag; mlxpa runs one model on one device (--ray "
                              "scales a file run out)",
}


def one_line(error: Exception) -> OneLineError:
    """click's usage ``error`` as one line naming the option: a value click could not convert
    reads ``--temperature: Input should be a valid number, ...``; an option of mlx-lm's or
    vLLM's commands says what mlxpa takes (:data:`HABITS`); a command's own check
    (``BadParameter`` without a parameter) keeps its message."""
    if isinstance(error, OneLineError):
        return error
    habit = HABITS.get(getattr(error, "option_name", None) or "")
    if habit is not None:
        return OneLineError(f"No such option: {error.option_name} ({habit})")
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


def plain_metavars(params) -> None:
    """Give ``params`` click's plain metavars: an argument ``INPUT``, not ``{INPUT}``, and no
    ``<str>`` type; an option's value ``N``, ``X``, ``PATH``, ``TEXT`` or ``[a|b]`` (its
    choices), not ``<int>``; flags none."""
    for p in params:  # Typer vendors click: its classes are not click's
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


class _OneLineErrors:
    """Usage errors (a bad value, an unknown option, a missing argument) as one line
    (:func:`one_line`), for a command or a group."""

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


class PlainUsageCommand(_OneLineErrors, TyperCommand):
    """A Typer command whose help reads as click's at 80 columns (:func:`plain_metavars`); its
    usage errors are one line."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        plain_metavars(self.params)

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p
                for p in super().collect_usage_pieces(ctx)]


class PlainUsageGroup(_OneLineErrors, TyperGroup):
    """A Typer group with options of its own (``mlxpa bench``) whose help reads as click's at
    80 columns (:func:`plain_metavars`); its usage errors are one line."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        plain_metavars(self.params)


def fail(console, error: Exception, code: int) -> NoReturn:
    """Print ``error`` on stderr unwrapped and without markup, then exit with ``code``."""
    console.print(f"error: {error}", style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code) from None
