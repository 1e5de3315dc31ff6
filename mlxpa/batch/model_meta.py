"""What a batch run knows of its model before the weights load: the tokenizer (loaded once,
then handed to the model load), the vocabulary size and the context from ``config.json``, and
the input processor built on them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlxpa.config import EngineConfig
from mlxpa.data import InputOptions
from mlxpa.inputs import InputProcessor

if TYPE_CHECKING:
    from mlxpa.engine import LLMEngine


class ModelMeta:
    """The model of a run, as the passes before the load see it (with a ready engine: the
    engine's own tokenizer, vocabulary and context).

    Args:
        config: The run's engine configuration (``model``, ``max_model_len``).
        engine: A ready engine, or None.
    """

    def __init__(self, config: EngineConfig, engine: LLMEngine | None = None) -> None:
        self.config, self.engine = config, engine
        self._tokenizer: Any = None

    def tokenizer(self) -> Any:
        """The model's mlx-lm ``TokenizerWrapper``, loaded at the first call.

        Raises:
            FileNotFoundError, ValueError: As :func:`mlxpa.loader.models.load_tokenizer_of`.
        """
        if self.engine is not None:
            return self.engine.tokenizer
        if self._tokenizer is None:
            from mlxpa.loader.models import load_tokenizer_of

            self._tokenizer = load_tokenizer_of(self.config.model, self.config.revision)
        return self._tokenizer

    def tokenizer_or_none(self) -> Any | None:
        """:meth:`tokenizer`, or None when it cannot be loaded (the checks that need it are
        then skipped; loading the model reports the problem)."""
        from mlxpa.loader.hub import HubModelError

        try:
            return self.tokenizer()
        except HubModelError:  # a repo id that cannot be had: said once, before any row
            raise
        except Exception:  # reported by the load that follows
            return None

    def vocab_size(self) -> int | None:
        """Token ids the model takes (None: ``config.json`` does not say)."""
        if self.engine is not None:
            return self.engine.runner.vocab_size
        from mlxpa.loader.models import peek_vocab_size

        return peek_vocab_size(self.config.model, self.config.revision)

    def context_len(self) -> int | None:
        """Longest prompt + output in tokens: the model's context (``config.json``) capped by
        ``max_model_len`` (None: neither is known)."""
        if self.engine is not None:
            return self.engine.runner.max_model_len
        from mlxpa.loader.models import peek_context_len

        known = [n for n in (peek_context_len(self.config.model, self.config.revision),
                                  self.config.max_model_len)
                 if n is not None]
        return min(known, default=None)

    def input_processor(self, inputs: InputOptions) -> InputProcessor:
        """The input processor of the run's rows: this model's tokenizer, vocabulary and
        context, ``inputs.split_special_tokens`` and ``inputs.chat_template``."""
        return InputProcessor(self.tokenizer(), self.vocab_size(), self.context_len(),
                              split_special_tokens=inputs.split_special_tokens,
                              chat_template=inputs.chat_template)
