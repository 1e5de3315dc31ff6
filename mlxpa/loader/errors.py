"""The error raised when a model cannot run through mlxpa's paged path."""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """A model architecture mlxpa refuses at load time (before any row runs).

    Args:
        model_type: The architecture name (mlx-lm's ``model_type``, else the class name).
        reason: Why it cannot run, in one line.

    The message is ``model type 'X' is not supported: reason``; the CLI prints it as one
    ``error:`` line (exit status 1).
    """

    def __init__(self, model_type: str, reason: str) -> None:
        self.model_type = model_type
        self.reason = reason
        super().__init__(f"model type {model_type!r} is not supported: {reason}")


def model_type_of(model) -> str:
    """mlx-lm's ``model_type`` of ``model`` (the attribute, else ``args.model_type``), else
    the last part of its module name (mlx-lm's file name for the architecture)."""
    name = getattr(model, "model_type", None)
    if not isinstance(name, str):
        name = getattr(getattr(model, "args", None), "model_type", None)
    if not isinstance(name, str):
        name = type(model).__module__.rsplit(".", 1)[-1]
    return name
