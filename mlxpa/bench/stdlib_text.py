"""Real prose and code for the text workloads, read offline from the installed Python standard
library with :mod:`inspect`: docstring paragraphs (``summarise``) and short top-level
functions with a parameter to rename (``code-edit``).

The modules are a fixed list of pure-Python ones present in every supported Python; their
public functions, classes and methods are walked in name order, so the pools are the same on
every run of one Python (another Python version has other docstrings and functions, hence
other rows). A function whose source cannot be read is left out.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import io
import keyword
import re
import tokenize
from typing import NamedTuple

MODULES = ("argparse", "ast", "base64", "bisect", "calendar", "codecs", "configparser",
           "contextlib", "copy", "csv", "dataclasses", "difflib", "email.utils", "enum",
           "filecmp", "fnmatch", "fractions", "functools", "gettext", "glob", "gzip", "heapq",
           "html", "inspect", "ipaddress", "json.decoder", "linecache", "locale", "logging",
           "mimetypes", "pathlib", "pickletools", "platform", "posixpath", "pprint", "queue",
           "random", "sched", "shlex", "shutil", "statistics", "string", "subprocess",
           "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "traceback",
           "urllib.parse", "uuid", "warnings", "weakref", "zipfile")
PARAGRAPH_WORDS = (40, 100)     # words of a docstring paragraph kept (joined to one line)
FUNCTION_LINES = (5, 16)        # lines of a function's source kept
FUNCTION_CHARS = 400            # and its most characters (a long docstring is left out)


class Function(NamedTuple):
    """A stdlib function to edit: its qualified name, source (verbatim), the parameter to
    rename and the source with it renamed to ``new_<parameter>``."""

    name: str
    source: str
    parameter: str
    renamed: str


def _members(module):
    """``(qualified name, object)`` of a module's public functions and classes defined in it,
    and of its classes' public methods, in name order."""
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", obj
        elif inspect.isclass(obj):
            yield f"{module.__name__}.{name}", obj
            for method, m in sorted(vars(obj).items()):
                if inspect.isfunction(m) and not method.startswith("_"):
                    yield f"{module.__name__}.{name}.{method}", m


def _modules():
    for name in MODULES:
        try:
            yield importlib.import_module(name)
        except ImportError:  # a Python built without it
            continue


_NOT_PROSE = re.compile(r">>>|::|^\s*[-*:|]|\n\s{2,}\S|\t", re.M)


@functools.cache
def docstring_paragraphs() -> tuple[tuple[str, str], ...]:
    """``(qualified name, paragraph)`` of every prose paragraph of the modules' docstrings
    (:data:`PARAGRAPH_WORDS` words, a capital first and a full stop last; no examples,
    lists or indented blocks), its lines joined with single spaces."""
    found = []
    for module in _modules():
        for name, obj in _members(module):
            doc = inspect.getdoc(obj) if obj.__doc__ else None
            for block in re.split(r"\n\s*\n", doc or ""):
                text = " ".join(block.split())
                low, high = PARAGRAPH_WORDS
                if (low <= len(text.split()) <= high and not _NOT_PROSE.search(block)
                        and text[0].isupper() and text.endswith(".")):
                    found.append((name, text))
    return tuple(found)


@functools.cache
def functions() -> tuple[Function, ...]:
    """The modules' top-level functions of :data:`FUNCTION_LINES` lines (at most
    :data:`FUNCTION_CHARS` characters, no doctest) with a parameter
    that can be renamed by its name alone (used in the body, never as a keyword argument
    or attribute name), one :class:`Function` per such parameter."""
    found = []
    for module in _modules():
        for name, obj in _members(module):
            if not inspect.isfunction(obj) or name.count(".") != module.__name__.count(".") + 1:
                continue
            try:
                source = inspect.getsource(obj)
            except (OSError, TypeError):
                continue
            low, high = FUNCTION_LINES
            lines = source.rstrip("\n").count("\n") + 1
            if (not low <= lines <= high or len(source) > FUNCTION_CHARS or source[0].isspace()
                    or ">>>" in source):
                continue
            for parameter in inspect.signature(obj).parameters:
                renamed = rename(source, parameter)
                if renamed is not None:
                    found.append(Function(name, source, parameter, renamed))
    return tuple(found)


def rename(source: str, parameter: str) -> str | None:
    """``source`` (one function) with the name ``parameter`` renamed to ``new_<parameter>``
    wherever it is a name (not in strings, comments or after a dot), or None where that is
    not a plain rename: the parameter is not used in the body, is passed as a keyword
    argument (``f(x=...)``) in the body, or is ``self``/``cls``."""
    if parameter in ("self", "cls") or keyword.iskeyword(parameter):
        return None
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return None
    hits, body_uses, depth, in_signature = [], 0, 0, True
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.OP:
            depth += tok.string in "([{"
            depth -= tok.string in ")]}"
            if tok.string == ":" and depth == 0:
                in_signature = False
        if tok.type != tokenize.NAME or tok.string != parameter:
            continue
        if i and tokens[i - 1].string == ".":
            continue
        after = tokens[i + 1].string if i + 1 < len(tokens) else ""
        if not in_signature and after == "=" and depth > 0:
            return None  # a keyword argument of a call: renaming it would change the call
        hits.append(tok.start)
        body_uses += not in_signature
    if not body_uses:
        return None
    lines = source.split("\n")
    for row, col in reversed(hits):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + "new_" + line[col:]
    return "\n".join(lines)
