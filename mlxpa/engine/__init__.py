"""The engine: requests in, outputs out (:class:`LLMEngine`), detokenization and metrics."""

from mlxpa.engine.llm_engine import LLMEngine, Passthrough, PromptInput

__all__ = ["LLMEngine", "Passthrough", "PromptInput"]
