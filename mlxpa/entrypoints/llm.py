"""``LLM``: vLLM's offline Python API (vLLM >= 0.12 names and shapes) over mlxpa's engine.

    llm = LLM("mlx-community/Qwen2.5-0.5B-Instruct-4bit")    # the model loads once, here
    outs = llm.generate(["Question: ...", {"prompt": "...", "max_tokens": 8}], SamplingParams())
    outs = llm.chat([{"role": "user", "content": "Hi"}])
    outs = llm.annotate(["a review ..."], "questions.json")      # typed questions, scored
    for out in llm.generate_iter(rows_of_a_huge_file): ...    # a stream, in constant memory

Every prompt becomes its engine request through the one input processor (a dict, mlxpa's
extension, read by the request schema as the row of ``mlxpa run`` it is), under its id, and
requests run through the streaming core the file run uses
(:class:`~mlxpa.engine.stream.RequestStream`), so a prompt gets the same tokens from ``LLM``
as from a file. :meth:`LLM.generate` and :meth:`LLM.chat` check every prompt before any model
work and raise naming the prompt's index; :meth:`LLM.generate_iter` reads its input once, so
a bad item gets its error in its output instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from rich.console import Console

from mlxpa.core.prefix_order import PREFIX_WINDOW
from mlxpa.engine import LLMEngine
from mlxpa.engine.idle_release import IdleRelease
from mlxpa.engine.metrics import Counters
from mlxpa.engine.progress import RunProgress
from mlxpa.engine.stream import RequestStream, in_input_order, windows
from mlxpa.entrypoints.engine_args import engine_config
from mlxpa.entrypoints.outputs import AnnotationOutput, RequestOutput, request_output
from mlxpa.entrypoints.prompts import (
    CallIds,
    PromptRequest,
    check_chat_options,
    check_params,
    conversation_list,
    dict_request,
    params_list,
    prompt_list,
    prompt_request,
)
from mlxpa.inputs import ChatPrompt, InputProcessor
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams


class LLM:
    """An offline LLM: a model loaded once, prompts in, :class:`RequestOutput` s out.

    Args:
        model: An MLX model folder, a Hugging Face repo id (downloaded on first use), a
            ``.gguf`` file, or None for the default model (Gemma 3 270M).
        **kwargs: Engine options: the fields of :class:`~mlxpa.config.EngineConfig`, vLLM's
            names where vLLM has the option (``revision``, ``dtype``, ``seed``,
            ``block_size``, ``kv_cache_memory_bytes``, ``kv_cache_dtype``, ``max_num_seqs``,
            ``max_num_batched_tokens``, ``max_model_len``, ``enable_prefix_caching``,
            ``disable_cascade_attn``, ``attention_backend``), mlxpa's own where it has none
            (``adapter_path``, ``keep_quantized``, ``kv_group_size``, ``kv_segment_bytes``,
            ``kv_release_after``, ``kv_cache_dir`` and ``kv_cache_disk_gb``: the disk KV tier,
            whose blocks are written at the end of each call).

    The KV pool starts at one segment (``kv_segment_bytes``, 64 MiB by default) and grows in
    place, by whole segments, to what a call's prompts can use (as ``mlxpa run`` sizes its
    pool; a stream of unknown length grows it as its steps need blocks), and further rather
    than evict cached prefixes, at most to the budget; the prefix cache is kept between calls.
    ``kv_release_after`` seconds (30) after a call ends with no other started, a thread of the
    ``LLM`` gives the segments back but one (the cached blocks that fit kept;
    :mod:`mlxpa.engine.idle_release`).

    Attributes:
        llm_engine: The engine (:class:`~mlxpa.engine.LLMEngine`); its ``counters`` are the
            last call's (``mlxpa.engine.metrics.summarize`` gives its statistics).

    Raises:
        TypeError: An unknown keyword (naming it and the closest valid one).
        ValueError: An option out of range (naming it); a model that cannot be loaded.
        FileNotFoundError: No such model folder or file.
    """

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        from mlxpa.entrypoints.loading import loading_model

        self._config = engine_config(model, kwargs)
        # the model loads (and is checked) here, once; the pool grows with each call (_fit)
        with loading_model():
            self.llm_engine = LLMEngine(self._config)
        self._active: object | None = None  # the stream that owns the engine now
        self._idle = IdleRelease(self.llm_engine)

    def get_tokenizer(self) -> Any:
        """The model's tokenizer (mlx-lm's ``TokenizerWrapper`` of the Hugging Face one)."""
        return self.llm_engine.tokenizer

    def generate(self, prompts: Any, sampling_params: SamplingParams | list[SamplingParams]
                 | None = None, *, use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate a completion for every prompt.

        Args:
            prompts: A string, a list of token ids (or vLLM's ``{"prompt_token_ids": [...]}``),
                a dict (a row of ``mlxpa run``: ``prompt`` or ``messages`` or
                ``prompt_token_ids``, ``id``, and its own sampling, constraint and logprobs
                fields), or a list of these.
            sampling_params: One :class:`SamplingParams` for every prompt, or one per prompt;
                a dict row's own fields override it. None: ``SamplingParams()`` (greedy, 256
                tokens).
            use_tqdm: Draw a progress bar on stderr.

        Returns:
            One :class:`RequestOutput` per prompt, in input order; its ``request_id`` is the
            prompt's id: a dict row's ``id`` (as text), else the prompt's index. Ids are
            unique per call, as ``mlxpa run`` keeps a file's: the first prompt with an id
            keeps it, and a later one that repeats it (its ``id`` field, or its index when it
            has none) is refused.

        Raises:
            TypeError, ValueError: A bad argument, naming it and the prompt's index
                (``prompts[3]: field "temperature" must be a finite number >= 0, got -1``,
                ``prompts[2]: duplicate id "a" (first at prompts[0]; ...)``); nothing has run.
        """
        items = prompt_list(prompts)
        params = params_list(sampling_params, len(items), self._processor())
        return self._run_all(items, params, use_tqdm, "prompts")

    def chat(self, messages: Any, sampling_params: SamplingParams | list[SamplingParams]
             | None = None, *, use_tqdm: bool = True,
             chat_template: str | None = None,
             chat_template_kwargs: dict[str, Any] | None = None,
             add_generation_prompt: bool = True) -> list[RequestOutput]:
        """Generate a reply to every conversation, rendered by the model's chat template
        exactly as a ``messages`` row of ``mlxpa run`` is.

        Args:
            messages: One conversation (a list of ``{"role", "content"}`` dicts) or a list
                of conversations.
            sampling_params: As :meth:`generate` (one, or one per conversation).
            use_tqdm: Draw a progress bar on stderr.
            chat_template: A Jinja chat template to use instead of the model's (vLLM's
                argument; needed for a model folder without one).
            chat_template_kwargs: More variables for the template (``enable_thinking``, ...).
            add_generation_prompt: End the prompt with the template's assistant turn opener.

        Returns:
            One :class:`RequestOutput` per conversation, in input order.

        Raises:
            TypeError, ValueError: As :meth:`generate` (naming ``messages[i]``), also when
                the model has no chat template or the template rejects a conversation.
        """
        check_chat_options(chat_template_kwargs, add_generation_prompt)
        if chat_template is not None and not isinstance(chat_template, str):
            raise TypeError("chat_template must be a template's text or None, got "
                            f"{type(chat_template).__name__}")
        chats = [ChatPrompt(c, chat_template_kwargs, add_generation_prompt)
                 for c in conversation_list(messages)]
        processor = self._processor(chat_template)
        params = params_list(sampling_params, len(chats), processor)
        return self._run_all(chats, params, use_tqdm, "messages", processor)

    def generate_iter(self, prompts: Iterable[Any], sampling_params: SamplingParams | None
                      = None, *, ordered: bool = True, window: int = PREFIX_WINDOW,
                      use_tqdm: bool = False) -> Iterator[RequestOutput]:
        """Stream ``prompts`` (an iterator larger than memory) through the model.

        The input is read once, lazily: a window of ``window`` prompts is read (and
        tokenized, and admitted in prefix order) when the engine needs more requests, so at
        most one window is read ahead of the requests in the engine (``max_num_seqs``
        running, ``2 * max_num_seqs`` waiting). With ``ordered``, a finished output also
        waits for every earlier one. Leaving the loop early (or an exception) aborts the
        prompts in flight.

        Args:
            prompts: Prompts as :meth:`generate` takes them, one per item (per-prompt
                sampling: dict rows with their own fields).
            sampling_params: One :class:`SamplingParams` for every prompt (None: the
                defaults).
            ordered: Yield in input order; False: as prompts finish.
            window: Prompts read, tokenized and ordered by shared prefix at a time.
            use_tqdm: Draw a progress bar (of unknown total) on stderr.

        Returns:
            An iterator of :class:`RequestOutput`; a prompt that cannot run (a bad field, a
            wrong type, an id an earlier prompt has, as in :meth:`generate`) gets ``error``
            naming ``prompts[i]``, in its place.

        Raises:
            TypeError, ValueError: A bad ``sampling_params`` or ``window``, at the call.
        """
        params = sampling_params or SamplingParams()
        processor = self._processor()
        check_params(params, "sampling_params", processor)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an integer >= 1, got {window!r}")
        ids = CallIds("prompts")
        items = (self._request_or_error(i, p, params, processor, ids)
                 for i, p in enumerate(prompts))
        self._fit(None)
        return _outputs(self._stream(windows(items, window), ordered, use_tqdm, None, "prompts"))

    # ---------------------------------------------------------------------------- internals

    def _processor(self, chat_template: str | None = None) -> InputProcessor:
        """The input processor of the engine's model (its vocabulary and context)."""
        engine = self.llm_engine
        return InputProcessor(engine.tokenizer, engine.runner.vocab_size,
                              engine.runner.max_model_len, chat_template=chat_template)

    @staticmethod
    def _request(index: int, prompt: Any, params: SamplingParams, processor: InputProcessor,
                 ids: CallIds, arg: str) -> PromptRequest:
        """The request of one prompt (a dict through the request schema), its id claimed.

        Raises:
            TypeError: ``prompt`` is not a prompt (naming ``arg[index]``).
        """
        if isinstance(prompt, dict):
            item = dict_request(index, prompt, params, processor, arg)
        else:
            item = prompt_request(index, prompt, params, processor, arg)
        duplicate = ids.claim(index, item.request_id, item.request_id != str(index))
        if duplicate is not None:
            item = item._replace(request=None, error=item.error or duplicate)
        return item

    def _request_or_error(self, index: int, prompt: Any, params: SamplingParams,
                          processor: InputProcessor, ids: CallIds) -> PromptRequest:
        try:
            return self._request(index, prompt, params, processor, ids, "prompts")
        except TypeError as e:
            return PromptRequest(index, str(index), None, error=str(e))

    def _run_all(self, items: list[Any], params: list[SamplingParams], use_tqdm: bool,
                 arg: str, processor: InputProcessor | None = None) -> list[RequestOutput]:
        """Every item checked first (raising on the first bad one), then run."""
        processor, ids, requests = processor or self._processor(), CallIds(arg), []
        for i, (item, p) in enumerate(zip(items, params)):
            request = self._request(i, item, p, processor, ids, arg)
            if request.error is not None:
                raise ValueError(request.error)
            requests.append(request)
        self._fit([r.request for r in requests])
        if any(r.request.sampling_params.structured_outputs is not None for r in requests):
            self.llm_engine.prepare()  # the grammar tokenizer, before the first step
        results: list[RequestOutput | None] = [None] * len(requests)
        for index, out in self._stream(windows(requests, PREFIX_WINDOW), False, use_tqdm,
                                       len(requests), arg):
            results[index] = out
        return results

    def _fit(self, requests: list[EngineRequest] | None) -> None:
        """Claim the engine for a call (no idle release until it ends) and grow the KV pool
        at once to what ``requests`` can use, at most its ceiling
        (:meth:`~mlxpa.engine.LLMEngine.kv_blocks_needed`, as ``mlxpa run``; None: an
        unknown need, grown as steps need blocks); the prefix cache is kept."""
        self._idle.hold()
        if requests is not None:
            engine = self.llm_engine
            engine.grow_kv_pool(engine.kv_blocks_needed(
                (len(r.prompt_token_ids), r.sampling_params.max_tokens, r.sampling_params.n)
                for r in requests))

    def annotate(self, documents: Any, questions: Any = None, *, calibration: Any = None,
                 permute_labels: bool = False,
                 use_tqdm: bool = True) -> list[AnnotationOutput]:
        """Answer typed questions about every document: each document prefilled once, each
        question's labels scored (never decoded), as ``mlxpa run --questions`` does
        (:mod:`mlxpa.entrypoints.annotate`; ``docs/annotation.md``).

        Args:
            documents: A text, a conversation (a list of ``{"role", "content"}`` dicts), a
                dict (a row of ``mlxpa run``: ``prompt`` or ``messages``, ``id``, its own
                ``questions``), or a list of these.
            questions: The question set: a path to its JSON file, its JSON value (a list of
                questions or ``{"preamble", "questions"}``) or a ``QuestionSet``; None: each
                document is a dict with its own ``questions``.
            calibration: A calibration file's path or a ``Calibration`` (``mlxpa
                calibrate``): the answers' ``probs`` are calibrated; None: raw.
            permute_labels: Also score each question that lists its labels with them listed
                in reverse (``permuted_label``, ``label_order_changed``).
            use_tqdm: Draw a progress bar on stderr.

        Returns:
            One :class:`AnnotationOutput` per document, in input order.

        Raises:
            TypeError, ValueError: A bad argument or document (naming ``documents[i]`` and
                the field); nothing has run.
        """
        from mlxpa.entrypoints.annotate import annotate

        return annotate(self, documents, questions, calibration, permute_labels, use_tqdm)

    def classify(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's ``LLM.classify`` runs a sequence-classification head, which mlxpa does not
        have.

        Raises:
            NotImplementedError: Always, naming :meth:`annotate` (typed questions, scored by
                the generative model).
        """
        raise NotImplementedError(
            "LLM.classify is vLLM's call for a classification head (outputs.probs), which "
            "mlxpa does not run; typed questions about documents are LLM.annotate(documents, "
            "questions)")

    def _stream(self, items: Iterable[list[PromptRequest]], ordered: bool, use_tqdm: bool,
                total: int | None, arg: str, convert: Callable[..., Any] = request_output
                ) -> Generator[tuple[int, Any]]:
        """Windows of prompts through the streaming core; ``(index, output)`` as prompts
        finish (or in input order), each output ``convert(result, decode, place)``. The
        engine's counters restart for the call (``llm_engine.counters``: this call's
        statistics). A later call takes the engine
        over: this stream then raises ``RuntimeError`` instead of reading another call's
        outputs."""
        engine, token = self.llm_engine, object()
        if engine.has_unfinished_requests():  # a stream left open: its prompts are dropped
            engine.abort_unfinished()
        self._active = token
        engine.counters = Counters()
        results = RequestStream(engine).run(items)
        results = in_input_order(results, _index) if ordered else results
        decode = engine.tokenizer.decode
        try:
            with RunProgress(total, engine.counters, Console(stderr=True), use_tqdm) as bar:
                while True:
                    if self._active is not token:
                        raise RuntimeError("another call on this LLM started while this "
                                           "generate_iter was open; its prompts were dropped")
                    result = next(results, None)
                    if result is None:
                        engine.write_back()  # the disk KV tier keeps what this call shared
                        return
                    bar.advance()
                    index = result.item.index
                    out = convert(result, decode, f"{arg}[{index}]")
                    engine.counters.failed_rows += out.error is not None
                    yield index, out
        finally:
            if self._active is token:
                self._active = None
                if engine.has_unfinished_requests():
                    engine.abort_unfinished()
                self._idle.arm()


def _index(item: PromptRequest) -> int:
    return item.index


def _outputs(pairs: Generator[tuple[int, RequestOutput]]) -> Iterator[RequestOutput]:
    """The outputs of ``(index, output)`` pairs; closing this closes ``pairs`` (its prompts
    in flight are aborted)."""
    with contextlib.closing(pairs):
        for _, out in pairs:
            yield out
