"""Constrained decoding with llguidance: one matcher per running request, one bitmask per step.

Backend: llguidance (guidance-ai/llguidance; used by vLLM, SGLang, TensorRT-LLM, llama.cpp).
Per step the model runner

1. starts the forward pass (``mx.async_eval``) and meanwhile calls :meth:`Grammars.fill`,
   which brings every constrained row's matcher up to the request's output tokens and fills
   the token bitmask of all of them in one ``fill_next_token_bitmask_par`` call (it releases
   the GIL, so it overlaps MLX's work, as vLLM and SGLang overlap it with the GPU);
2. the bitmask is applied to all of the step's rows in one fused MLX pass
   (:func:`mlxpa.worker.sample_step.apply_bitmask`; unconstrained rows get all bits set);
   llguidance sets the EOS bit only where the grammar accepts, so EOS ends a row only when
   its output is complete;
3. samples, then :meth:`Grammars.advance` consumes each sampled token; a matcher that is then
   stopped (nothing but EOS may follow) ends its row at once (:meth:`Grammars.is_complete`).

Matchers are keyed by the :class:`Request` object and synced to ``output_token_ids`` (consume
what is missing, roll back what is extra), so preemption by recompute (output tokens kept),
chunked prefill (no sampling until the last chunk), prefix-cache hits and ``n > 1`` forks (a
child is another request with its own matcher) need no special case. Compiled grammars are
cached by the constraint's canonical text.

A ``choice`` constraint is compiled over tokens, not text (:func:`choice_grammar`): each choice
can be written only through its canonical tokenization (the tokenizer's own encoding of the
choice, the tokens ``choice_logprobs`` scores), so the label is never spelt through an
unlikely split such as ``' '`` then ``'green'`` (the token healing problem that outlines and
SGLang discuss for choice decoding).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from mlxpa.request import Request
from mlxpa.structured_spec import StructuredOutput, grammar_text


@dataclass(slots=True)
class _State:
    matcher: object  # llguidance.LLMatcher
    consumed: int = 0


_LL_TOKENIZERS: dict[tuple[int, int, tuple[int, ...]], tuple[object, Future]] = {}


def start_ll_tokenizer(hf_tokenizer, vocab_size: int, eos_token_ids: list[int]) -> Future:
    """Start building the ``llguidance.LLTokenizer`` of a Hugging Face tokenizer in a daemon
    thread, once per tokenizer object, vocabulary size and EOS ids (kept for later engines);
    :func:`ll_tokenizer` waits for it. The build takes seconds for Gemma's 262k vocabulary
    (3 to 18 s on 2 shared x86 cores), so ``mlxpa run`` starts it as soon as the tokenizer
    has loaded and it overlaps the weights' load and the engine's set-up (llguidance holds
    the GIL while it builds; MLX's work releases it).

    ``llguidance.hf.from_tokenizer`` is used when llguidance knows the tokenizer's decoder
    (without its copy of the tokenizer when the tokenizer pads and truncates nothing);
    otherwise the vocabulary is given token by token (each id's decoded bytes; special
    tokens as ``0xFF`` + name, llguidance's convention).

    Args:
        hf_tokenizer: A ``transformers.PreTrainedTokenizerFast``.
        vocab_size: Width of the model's logits (bitmask width).
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


def ll_tokenizer(hf_tokenizer, vocab_size: int, eos_token_ids: list[int]):
    """The ``llguidance.LLTokenizer`` of :func:`start_ll_tokenizer` (started now if it was
    not), waiting for its build."""
    return start_ll_tokenizer(hf_tokenizer, vocab_size, eos_token_ids).result()


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


def choice_grammar(choices: tuple[str, ...], hf_tokenizer) -> str:
    """An llguidance grammar whose only outputs are the choices' canonical token sequences.

    Each choice is encoded on its own (``encode(choice, add_special_tokens=False)``, as
    :mod:`mlxpa.engine.choice_scores` scores it) and becomes one alternative of a Lark rule
    over token ids (llguidance's ``<[id]>`` token syntax). A choice whose tokens are a prefix
    of another's is accepted there (EOS or the longer choice's next token may follow).

    Args:
        choices: The choices (non-empty strings).
        hf_tokenizer: The model's Hugging Face tokenizer.

    Returns:
        The grammar in llguidance's JSON grammar format.
    """
    from llguidance import grammar_from

    alternatives = (" ".join(f"<[{t}]>" for t in hf_tokenizer.encode(c, add_special_tokens=False))
                    for c in choices)
    return grammar_from("lark", "start: " + " | ".join(alternatives))


class Grammars:
    """Matchers of the constrained requests (runner-side state, like the block tables).

    Args:
        hf_tokenizer: The model's Hugging Face tokenizer.
        vocab_size: Width of the model's logits (None: taken from the first step's logits).
        eos_token_ids: The model's EOS ids.

    Attributes:
        mask_time_s: Seconds spent syncing matchers and filling bitmasks (all steps; the
            one-time tokenizer build is not included, grammar compiles are).
        num_mask_steps: Steps that filled at least one bitmask.
    """

    def __init__(self, hf_tokenizer, vocab_size: int | None,
                 eos_token_ids: list[int]) -> None:
        self._hf = hf_tokenizer
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._ll = None
        self._executor = None
        self._compiled: dict[StructuredOutput, str] = {}
        self._states: dict[Request, _State] = {}
        self.mask_time_s = 0.0
        self.num_mask_steps = 0

    def tokenizer_ready(self) -> bool:
        """Whether :meth:`prepare` would return without waiting for the tokenizer build
        (which this starts in the background if nothing started it)."""
        if self._ll is not None or self.vocab_size is None:
            return True
        return start_ll_tokenizer(self._hf, self.vocab_size, self._eos).done()

    def prepare(self) -> None:
        """Build the llguidance tokenizer (or wait for the build that
        :func:`start_ll_tokenizer` started) and the executor now (once; not counted as mask
        time)."""
        import llguidance

        if self._ll is None and self.vocab_size is not None:
            self._ll = ll_tokenizer(self._hf, self.vocab_size, self._eos)
            self._executor = llguidance.LLExecutor()

    def _matcher(self, so: StructuredOutput):
        import llguidance

        self.prepare()
        if so not in self._compiled:
            self._compiled[so] = self._compile(so)
        return llguidance.LLMatcher(self._ll, self._compiled[so], log_level=0)

    def _compile(self, so: StructuredOutput) -> str:
        """The grammar of ``so``: a choice over canonical token sequences when llguidance's
        matcher accepts every choice's own tokens through it, else the text grammar (some
        token grammars reject a canonical sequence, e.g. a choice whose tokens include a
        ``,`` or ``.`` after a word: llguidance lexes the token there as another lexeme)."""
        import llguidance

        if so.kind != "choice":
            return grammar_text(so)
        grammar = choice_grammar(so.choices, self._hf)
        for choice in so.choices:
            m = llguidance.LLMatcher(self._ll, grammar, log_level=0)
            for token in self._hf.encode(choice, add_special_tokens=False):
                m.compute_bitmask()  # as each step does: the forced-token path runs here
                if not m.consume_token(token) or m.is_error():
                    return grammar_text(so)
            if not m.is_accepting():
                return grammar_text(so)
        return grammar

    def _state(self, req: Request) -> _State:
        st = self._states.get(req)
        if st is None:
            st = self._states[req] = _State(self._matcher(req.sampling_params.structured))
        out = req.output_token_ids
        if st.consumed > len(out):
            st.matcher.rollback(st.consumed - len(out))
            st.consumed = len(out)
        if st.consumed < len(out):
            st.matcher.consume_tokens(out[st.consumed:])
            st.consumed = len(out)
        return st

    def fill(self, reqs: list[Request], vocab_size: int) -> tuple[list[int], np.ndarray] | None:
        """Bitmask of the step's rows (``reqs``, the rows about to sample) for logits
        ``vocab_size`` wide: each constrained row's from its matcher, all tokens for the others.

        Returns:
            ``(rows, bitmask)``: the indices of the constrained rows in ``reqs`` and a
            ``[len(reqs), ceil(V / 32)]`` int32 bitmask (bit ``t % 32`` of word ``t // 32`` set
            = token ``t`` allowed; the bits past ``V`` are clear), or None when no row is
            constrained.
        """
        rows = [i for i, r in enumerate(reqs) if r.sampling_params.structured is not None]
        if not rows:
            return None
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask_par

        if self.vocab_size is None:
            self.vocab_size = vocab_size
        self.prepare()
        t0 = time.perf_counter()
        states = [self._state(reqs[i]) for i in rows]
        bitmask = allocate_token_bitmask(len(reqs), self.vocab_size)  # all allowed
        fill_next_token_bitmask_par(self._executor, [(s.matcher, i) for i, s in
                                                     zip(rows, states)], bitmask)
        if self.vocab_size % 32:
            bitmask[:, -1] &= (1 << self.vocab_size % 32) - 1
        self.mask_time_s += time.perf_counter() - t0
        self.num_mask_steps += 1
        return rows, bitmask

    def advance(self, reqs: list[Request], tokens: list[int]) -> None:
        """Consume each constrained request's sampled token (``tokens[i]`` for ``reqs[i]``)."""
        for req, tok in zip(reqs, tokens):
            st = self._states.get(req)
            if st is not None and st.consumed == req.num_output_tokens:
                st.matcher.consume_token(tok)
                st.consumed += 1

    def is_complete(self, req: Request) -> bool:
        """True when ``req``'s grammar is satisfied and admits nothing more (only EOS)."""
        st = self._states.get(req)
        return st is not None and st.matcher.is_stopped() and not st.matcher.is_error()

    def error(self, req: Request) -> str | None:
        """The matcher's error (a token outside the grammar was consumed), else None."""
        st = self._states.get(req)
        if st is None or not st.matcher.is_error():
            return None
        return st.matcher.get_error() or "the output left the grammar"

    def release(self, req: Request) -> None:
        """Drop ``req``'s matcher (finished)."""
        self._states.pop(req, None)
