"""Constrained decoding with llguidance: one matcher per running request, one bitmask per step.

The model runner owns the :class:`Grammars` (the mask must overlap its forward pass). Per step:

1. while the forward pass runs (``mx.async_eval``), :meth:`Grammars.fill` brings every
   constrained request's matcher up to its output tokens and fills all their bitmasks in one
   ``fill_next_token_bitmask_par`` call (it releases the GIL, as vLLM and SGLang overlap it
   with the GPU);
2. the bitmask is applied to all of the step's requests in one fused MLX pass
   (:func:`mlxpa.structured.mask.apply_bitmask`); llguidance allows EOS only where the grammar
   accepts;
3. after sampling, :meth:`Grammars.advance` consumes each token and reports the grammars that
   ended (complete or failed).

Matchers are keyed by the request (its ``key``) and synced to its ``output_token_ids`` (consume what
is missing, roll back what is extra), so preemption, chunked prefill, prefix-cache hits and
``n > 1`` forks need no special case. Compiled grammars are cached by the constraint's
canonical text. A ``choice`` row has no matcher: its labels are scored
(:mod:`mlxpa.engine.choice_scores`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from mlxpa.request import Request
from mlxpa.sampling_params import StructuredOutput
from mlxpa.structured.spec import grammar_text


@dataclass(slots=True)
class _State:
    matcher: object  # llguidance.LLMatcher
    consumed: int = 0


_LL_TOKENIZERS: dict[tuple[int, int, tuple[int, ...]], tuple[object, Future]] = {}


def start_ll_tokenizer(hf_tokenizer, vocab_size: int, eos_token_ids: list[int]) -> Future:
    """Start building the ``llguidance.LLTokenizer`` of a Hugging Face tokenizer in a daemon
    thread, once per tokenizer object, vocabulary size and EOS ids (kept for later engines);
    :meth:`Grammars.prepare` waits for it. The build takes seconds for Gemma's 262k
    vocabulary, so ``mlxpa run`` starts it as soon as the tokenizer has loaded
    (:func:`start_grammar_tokenizer`) and it overlaps the weights' load and the engine's
    set-up (llguidance holds the GIL while it builds; MLX's work releases it).

    ``llguidance.hf.from_tokenizer`` is used when llguidance knows the tokenizer's decoder
    (without its copy of the tokenizer when the tokenizer pads and truncates nothing);
    otherwise the vocabulary is given token by token (each id's decoded bytes; special
    tokens as ``0xFF`` + name, llguidance's convention).

    Args:
        hf_tokenizer: A ``transformers.PreTrainedTokenizerFast``.
        vocab_size: Token ids the model takes and scores (the bitmask's width).
        eos_token_ids: Ids the grammar allows once it accepts.

    Returns:
        The build's future (its ``result()`` raises what the build raised).
    """
    key = (id(hf_tokenizer), vocab_size, tuple(eos_token_ids))
    held = _LL_TOKENIZERS.get(key)
    if held is not None and held[0] is hf_tokenizer:
        return held[1]
    future: Future = Future()

    def build() -> None:
        try:
            future.set_result(_build_ll_tokenizer(hf_tokenizer, vocab_size,
                                                  list(eos_token_ids)))
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            future.set_exception(e)

    _LL_TOKENIZERS[key] = (hf_tokenizer, future)
    threading.Thread(target=build, name="llguidance-tokenizer", daemon=True).start()
    return future


def start_grammar_tokenizer(tokenizer, config: dict) -> None:
    """Start llguidance's tokenizer build for a model whose tokenizer has just loaded (the
    ``on_tokenizer`` hook of :func:`mlxpa.loader.models.load_model`), so it overlaps the
    weights' load.

    The build is keyed by the vocabulary size of the model's ``config.json`` (``config``),
    which for mlx-lm's models is the width of the logits the runner's :class:`Grammars` asks
    for after the load; a model whose logits differ only pays for a second build.

    Args:
        tokenizer: The model's mlx-lm ``TokenizerWrapper``.
        config: The model's ``config.json`` contents.
    """
    from mlxpa.loader.models import vocab_size_of

    vocab = vocab_size_of(config)
    if vocab is not None:
        start_ll_tokenizer(tokenizer._tokenizer, vocab, sorted(tokenizer.eos_token_ids))


def _build_ll_tokenizer(hf_tokenizer, vocab_size: int, eos_token_ids: list[int]):
    import llguidance
    import llguidance.hf

    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    try:
        if backend is not None and backend.padding is None and backend.truncation is None:
            # what from_tokenizer does, without its copy (1-2 s of Gemma's build)
            return llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab_size,
                                          eos_token=eos_token_ids)
        return llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size,
                                            eos_token=eos_token_ids)
    except ValueError:
        vocab = llguidance.TokenizerWrapper(_Vocabulary(hf_tokenizer, vocab_size,
                                                        eos_token_ids))
        return llguidance.LLTokenizer(vocab, n_vocab=vocab_size, eos_token=eos_token_ids)


class _Vocabulary:
    """The ``TokenizerWrapper`` protocol of llguidance over any HF tokenizer."""

    def __init__(self, hf, vocab_size: int, eos_token_ids: list[int]) -> None:
        special = set(hf.all_special_ids)
        self.eos_token_id = eos_token_ids[0] if eos_token_ids else hf.eos_token_id
        self.bos_token_id = hf.bos_token_id
        self.special_token_ids = sorted(special | set(eos_token_ids))
        size = min(vocab_size, len(hf))
        names = hf.convert_ids_to_tokens(list(range(size)))
        self.tokens = [b"\xff" + str(names[i]).encode() if i in self.special_token_ids
                       else hf.decode([i]).encode() for i in range(size)]
        self._hf = hf

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._hf.encode(text, add_special_tokens=False)


class Bitmask(NamedTuple):
    """One step's token bitmask (llguidance's layout).

    Attributes:
        rows: Indices of the constrained requests' rows among the step's sampling rows.
        words: ``[S, ceil(V / 32)]`` int32: bit ``t % 32`` of word ``t // 32`` set = token
            ``t`` allowed (every bit of an unconstrained request; the bits past ``V`` clear).
        fill_s: Seconds spent syncing the matchers and filling it (grammar compiles
            included, the one-time tokenizer build not).
    """

    rows: list[int]
    words: np.ndarray
    fill_s: float


class Grammars:
    """Matchers of the constrained requests (runner-side state, like the block tables).

    Args:
        hf_tokenizer: The model's Hugging Face tokenizer.
        vocab_size: Token ids the model takes and scores (the runner's ``vocab_size``): the
            grammar tokenizer's vocabulary and the bitmask's width.
        eos_token_ids: The model's EOS ids.
    """

    def __init__(self, hf_tokenizer, vocab_size: int, eos_token_ids: list[int]) -> None:
        self._hf = hf_tokenizer
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._ll = None
        self._executor = None
        self._compiled: dict[StructuredOutput, str] = {}
        self._states: dict[int, _State] = {}  # by request key

    def prepare(self, on_wait: Callable[[int], None] | None = None) -> bool:
        """Build the llguidance tokenizer (or wait for the build :func:`start_ll_tokenizer`
        started) and the executor now, once (not counted in :attr:`Bitmask.fill_s`).

        Args:
            on_wait: Called with the vocabulary size before waiting, when the build is not
                done yet.

        Returns:
            Whether it had to wait for the build.
        """
        import llguidance

        if self._ll is not None:
            return False
        future = start_ll_tokenizer(self._hf, self.vocab_size, self._eos)
        waited = not future.done()
        if waited and on_wait is not None:
            on_wait(self.vocab_size)
        self._ll = future.result()
        self._executor = llguidance.LLExecutor()
        return waited

    def _matcher(self, so: StructuredOutput):
        import llguidance

        self.prepare()
        if so not in self._compiled:
            self._compiled[so] = grammar_text(so)
        return llguidance.LLMatcher(self._ll, self._compiled[so], log_level=0)

    def _state(self, req: Request) -> _State:
        st = self._states.get(req.key)
        if st is None:
            so = req.sampling_params.structured_outputs
            st = self._states[req.key] = _State(self._matcher(so))
        out = req.output_token_ids
        if st.consumed > len(out):
            st.matcher.rollback(st.consumed - len(out))
            st.consumed = len(out)
        if st.consumed < len(out):
            st.matcher.consume_tokens(out[st.consumed:])
            st.consumed = len(out)
        return st

    def fill(self, rows, drafts: list[list[int]] | None = None) -> Bitmask | None:
        """The bitmask of a step's sampling rows (:class:`~mlxpa.worker.sampler.Rows`):
        each constrained request's from its matcher, its draft rows' after the drafts before
        them (llguidance's draft-token fill, which rolls the matcher back; rows after a draft
        the grammar refuses stay open: they are rejected there), every token for the others;
        None when no request is constrained."""
        reqs = [rows.reqs[f] for f in rows.first]
        cons = [i for i, r in enumerate(reqs) if r.sampling_params.structured_outputs is not None]
        if not cons:
            return None
        from llguidance.numpy import (
            allocate_token_bitmask,
            fill_next_token_bitmask_par,
            fill_next_token_bitmask_par_with_draft_tokens,
        )

        self.prepare()
        t0 = time.perf_counter()
        states = [(i, self._state(reqs[i])) for i in cons]
        bitmask = allocate_token_bitmask(len(rows.reqs), self.vocab_size)  # all allowed
        plain = [(st.matcher, rows.first[i]) for i, st in states if not drafts or not drafts[i]]
        if plain:
            fill_next_token_bitmask_par(self._executor, plain, bitmask)
        drafted = [(st.matcher, rows.first[i], list(drafts[i])) for i, st in states
                   if drafts and drafts[i]]
        if drafted:
            fill_next_token_bitmask_par_with_draft_tokens(self._executor, drafted, bitmask)
        if self.vocab_size % 32:
            bitmask[:, -1] &= (1 << self.vocab_size % 32) - 1
        covered = [k for k, o in enumerate(rows.owner) if o in set(cons)]
        return Bitmask(covered, bitmask, time.perf_counter() - t0)

    def advance(self, reqs: list[Request], tokens: list[list[int]]) -> dict[int, str | None]:
        """Consume each constrained request's emitted tokens (``tokens[i]`` for ``reqs[i]``),
        cutting the list after a token that ends its grammar.

        Returns:
            The keys of the requests whose grammar ended with their last kept token: None
            when it is complete (satisfied, admitting nothing but EOS), else the matcher's
            error (a token outside the grammar). Requests whose grammar goes on are absent.
        """
        ended: dict[int, str | None] = {}
        for req, toks in zip(reqs, tokens):
            st = self._states.get(req.key)
            if st is None or st.consumed != req.num_output_tokens:
                continue
            for j, tok in enumerate(toks):
                st.matcher.consume_token(tok)
                st.consumed += 1
                if st.matcher.is_error():
                    ended[req.key] = st.matcher.get_error() or "the output left the grammar"
                elif st.matcher.is_stopped():
                    ended[req.key] = None
                if req.key in ended:
                    del toks[j + 1:]
                    break
        return ended

    def draft_prefix(self, req: Request, num_output_tokens: int,
                     drafts: list[int]) -> list[int]:
        """``drafts`` cut before the first token ``req``'s grammar refuses after its first
        ``num_output_tokens`` output tokens (the matcher's state after :meth:`advance`; all
        of them for an unconstrained request); where the grammar forces the next tokens
        (llguidance's fast-forward tokens), those instead: jump-forward as drafts."""
        st = self._states.get(req.key)
        if st is None:
            return drafts
        if st.consumed != num_output_tokens or st.matcher.is_stopped():
            return []
        forced = st.matcher.compute_ff_tokens()
        if forced:
            return list(forced)
        return drafts[:st.matcher.validate_tokens(drafts)]

    def release(self, req: Request) -> None:
        """Drop ``req``'s matcher (finished)."""
        self._states.pop(req.key, None)
