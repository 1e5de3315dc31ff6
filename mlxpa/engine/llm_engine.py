"""The engine: the only glue between requests, scheduler, model runner and outputs.

``LLMEngine.step()`` reads as vLLM's: ``Scheduler.schedule()`` → ``ModelRunner.execute()`` →
update (forks, log-probabilities, scores, ``Scheduler.update_from_output()``) → stops
(incremental detokenization and stop strings, grammar endings), and returns the requests that
finished. Requests come in by the caller's string id (``add_request``) and can be dropped by it
(``abort_request``); ``generate()`` streams requests in from any iterable, admitting more only
while the waiting queue is short, so large inputs never sit in memory.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator

from mlxpa.config import EngineConfig
from mlxpa.core.block_pool import BlockPool
from mlxpa.core.kv_cache_manager import KVCacheManager
from mlxpa.core.kv_sizing import kv_blocks_needed
from mlxpa.core.scheduler import Scheduler, SchedulerOutput
from mlxpa.engine.choice_scores import ChoiceScores, is_choice
from mlxpa.engine.deltas import final_delta, step_delta, wants_deltas
from mlxpa.engine.detokenizer import IncrementalDetokenizer, check_stop
from mlxpa.engine.disk_tier import open_disk_store, record_disk
from mlxpa.engine.forks import Forks
from mlxpa.engine.metrics import Counters
from mlxpa.engine.question_scores import QuestionScores
from mlxpa.messages import request_token_id_problem
from mlxpa.request import (
    EngineRequest,
    QuestionPrompt,
    Request,
    RequestStatus,
    SampleOutput,
    cache_salt_problem,
    sample_output,
)
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker.model_runner import ModelRunner
from mlxpa.worker.outputs import StepResult


class LLMEngine:
    """Continuous-batching engine over a paged KV cache.

    Start-up has vLLM's two phases: the model runner probes and checks the model once
    (:class:`ModelRunner`), then the KV pool is built: for ``kv_blocks_needed`` when the work
    is known (a file run), else a pool that starts at one segment and grows by segments as
    steps need blocks, up to the budget (:mod:`mlxpa.core.pool_size`), and gives its segments
    back but one when :meth:`release_kv_memory` is called while idle (a server
    ``kv_release_after`` seconds after its last step). :meth:`resize_kv_pool` rebuilds the
    pool later without touching the runner.

    Args:
        config: Engine configuration.
        model: An mlx-lm model; None loads ``config.model`` (the default Gemma 3 270M when
            that is None).
        tokenizer: The model's mlx-lm ``TokenizerWrapper`` (required with ``model``).
        kv_blocks_needed: Most blocks the work can use, null block included: the pool takes
            that, at most the memory budget; None (work unknown): a pool that grows up to the
            budget (``config.kv_segment_bytes``).
        expected_requests: The work, ``(prompt_tokens, max_tokens, n)`` per request, in place
            of ``kv_blocks_needed`` (:meth:`kv_blocks_needed` sizes the pool for them).
        model_folder: The folder ``model`` was loaded from (the disk KV tier's model identity
            is then its files'; None with a ``model``: its weights are hashed).
    """

    def __init__(self, config: EngineConfig, model=None, tokenizer=None, *,
                 kv_blocks_needed: int | None = None,
                 expected_requests: Iterable[tuple[int, int, int]] | None = None,
                 model_folder: str | os.PathLike[str] | None = None) -> None:
        if model is None:
            from mlxpa.loader.models import load_model

            model, tokenizer, model_folder = load_model(config)
        self.config = config
        self.tokenizer = tokenizer
        self.runner = ModelRunner(model, config, frozenset(tokenizer.eos_token_ids),
                                  tokenizer._tokenizer)
        self.disk_store = open_disk_store(config, self.runner, model, tokenizer, model_folder)
        self.runner.disk_store = self.disk_store
        self.counters = Counters()
        self._detok: dict[int, IncrementalDetokenizer] = {}  # by request key
        self._released: list[SampleOutput] = []
        self._unfinished: dict[str, int] = {}  # request id -> its samples not yet returned
        if expected_requests is not None:
            kv_blocks_needed = self.kv_blocks_needed(expected_requests)
        ceiling = self.runner.kv_blocks_for(kv_blocks_needed)
        self._build_pool(ceiling, None if kv_blocks_needed is not None else (
            self.runner.kv_segment_blocks(ceiling)))

    def kv_blocks_needed(self, requests: Iterable[tuple[int, int, int]]) -> int:
        """Most KV blocks ``requests`` (``(prompt_tokens, max_tokens, n)`` each, read lazily)
        can hold at once in this model's KV cache groups, null block included, at most the
        memory budget's blocks (:func:`mlxpa.core.kv_sizing.kv_blocks_needed`)."""
        return kv_blocks_needed(requests, self.runner.kv_cache_layout,
                                self.config.max_num_batched_tokens, self.runner.budget_blocks,
                                self.runner.max_model_len)

    def _build_pool(self, num_blocks: int, segment_blocks: int | None = None) -> None:
        """The runner's pools, the block pool, its manager and the scheduler for
        ``num_blocks`` blocks (an empty prefix cache); with ``segment_blocks``, a pool that
        starts at one segment and may grow to ``num_blocks``."""
        pool = BlockPool(num_blocks, self.config.block_size, segment_blocks, segment_blocks)
        self.runner.allocate_kv_cache(pool.num_blocks)
        self.kv_cache_manager = KVCacheManager(pool, self.config.enable_prefix_caching,
                                               self.runner.kv_cache_layout)
        if self.disk_store is not None and not self.kv_cache_manager.attach_disk(
                self.disk_store):
            logging.getLogger("mlxpa").info(
                "KV disk cache: off for this model (%s)", "no prefix caching"
                if not self.config.enable_prefix_caching else "it has no K/V blocks")
        self.scheduler = Scheduler(self.config, self.kv_cache_manager,
                                   self.runner.max_model_len,
                                   frozenset(self.tokenizer.eos_token_ids))
        self.choice_scores = self._choice_scores()
        self.question_scores = QuestionScores(self.choice_scores, self._output)
        self.forks = Forks(self.scheduler, self.choice_scores, self.question_scores,
                           self._new_sample)

    def resize_kv_pool(self, num_blocks: int) -> None:
        """Rebuild the KV pool with ``num_blocks`` blocks (null block included; see
        :meth:`ModelRunner.kv_blocks_for`): the runner's pools, the :class:`BlockPool`, the
        :class:`KVCacheManager` and the :class:`Scheduler`; the model, its checks and the
        counters are kept, the prefix cache starts empty.

        Raises:
            RuntimeError: A request is in flight (:meth:`abort_unfinished` first).
            ValueError: ``num_blocks`` below 2.
        """
        if self.has_unfinished_requests():
            raise RuntimeError("resize_kv_pool needs an engine with no request in flight "
                               "(abort_unfinished() drops them)")
        if self.scheduler.has_finished_requests():
            self.step()  # SchedulerOutput.finished: the runner frees their state
        self.write_back()
        self._build_pool(num_blocks)

    def write_back(self) -> int:
        """Write the prefix cache's blocks worth keeping that the disk lacks (the disk KV
        tier, :mod:`mlxpa.core.kv_disk`) and wait for the files; returns the block positions
        written (0 without the tier). Called at the end of a run, a server's shutdown, before
        the pool is rebuilt."""
        disk = self.kv_cache_manager.disk
        if disk is None:
            return 0
        saves = disk.write_back()
        self.runner.save_kv(saves)
        self.disk_store.flush()
        record_disk(self.counters, self.disk_store, disk.take_hit_tokens())
        return len(saves)

    def close(self) -> None:
        """:meth:`write_back`, then stop the disk tier's writer (nothing else to release)."""
        if self.disk_store is not None:
            self.write_back()
            self.disk_store.close()

    def grow_kv_pool(self, num_blocks: int) -> None:
        """Let a growing pool hold at least ``num_blocks`` blocks (null block included;
        whole segments, at most its ceiling) from the next step on: work known to need them
        (an ``LLM`` call), so they are allocated once rather than segment by segment."""
        self.kv_cache_manager.grow_pool(num_blocks)

    def kv_release_due(self) -> float | None:
        """Seconds until :meth:`release_kv_memory` is due (``kv_release_after`` after the
        last step; 0: now), or None when there is nothing to give back
        (:meth:`Scheduler.kv_release_due`)."""
        return self.scheduler.kv_release_due(time.monotonic())

    def release_kv_memory(self) -> bool:
        """Shrink a KV pool that holds more than one segment back to one, now, if no request
        is in flight: the cached blocks that fit are kept (moved into the first segment), the
        rest evicted, and the memory goes back to the system (:mod:`mlxpa.core.pool_size`).
        Returns whether it shrank."""
        pool = self.kv_cache_manager.pool
        if self.has_unfinished_requests() or pool.num_blocks <= pool.segment_blocks:
            return False
        self.write_back()  # the disk tier keeps what the shrink may evict
        self.runner.execute(self.scheduler.release_kv_memory())
        self.counters.kv_pool_releases += 1
        return True

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    def prepare(self, on_wait: Callable[[int], None] | None = None) -> bool:
        """Make the first constrained step ready now (its wait then falls outside the steps
        and their mask time): wait for the grammar tokenizer's background build
        (:meth:`ModelRunner.prepare`).

        Args:
            on_wait: Called with the vocabulary size before waiting, when the build is not
                done yet.

        Returns:
            Whether it had to wait.
        """
        return self.runner.prepare(on_wait)

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    sampling_params: SamplingParams,
                    questions: tuple[QuestionPrompt, ...] | None = None,
                    cache_salt: str | None = None) -> None:
        """Queue a request (``sampling_params.n`` samples of one prompt: sample 0 runs the
        prefill; when it is done, the others fork its blocks while ``max_num_seqs`` leaves
        slots and the rest wait, reading the prompt from the prefix cache when admitted). A
        ``choice`` row is scored, not decoded (:mod:`mlxpa.engine.choice_scores`): one
        prefill, its labels' tokens, ``n`` labels drawn from the scores.

        Args:
            request_id: The caller's id (vLLM's ``request_id``): what :meth:`abort_request`
                takes and every :class:`SampleOutput` of the request carries; an unseeded
                request's randomness is derived from it.
            prompt_token_ids: The prompt (checked here against the vocabulary and context).
            sampling_params: How to sample and when to stop.
            questions: A question group (:mod:`mlxpa.engine.question_scores`): the document
                prefilled once, each question scored as a choice row forking its blocks; one
                output with ``question_scores``. None: a plain request.
            cache_salt: vLLM's ``cache_salt``: the request (its samples, its scoring
                requests) reuses prefix-cache blocks only of requests with the same salt;
                None: the unsalted namespace.

        Outputs leave only through :meth:`step`: a request that needs no model work
        (``max_tokens`` 0, not a choice row) or cannot run (empty prompt, longer than the
        context or the pool, labels that cannot be scored: ``finish_reason`` ``abort`` with
        ``error`` set) has its finished :class:`SampleOutput` s (one per sample) in the next
        step's.

        Raises:
            TypeError: ``request_id`` is not a string, ``cache_salt`` neither a string nor None.
            ValueError: ``request_id`` is the id of an unfinished request; ``cache_salt`` is
                empty or longer than :data:`~mlxpa.request.MAX_CACHE_SALT_CHARS`.
        """
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a string, got {type(request_id).__name__}")
        problem = cache_salt_problem(cache_salt)
        if problem is not None:  # a salt the tree cannot key by must not reach the engine loop
            raise (ValueError if isinstance(cache_salt, str) else TypeError)(problem)
        if request_id in self._unfinished:
            raise ValueError(f"request id {request_id!r} is already running")
        done = self._add(request_id, prompt_token_ids, sampling_params, questions, cache_salt)
        if done:  # returned by the next step
            self._unfinished[request_id] = len(done)
            self._released.extend(done)

    def _add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
             questions: tuple[QuestionPrompt, ...] | None,
             cache_salt: str | None) -> list[SampleOutput] | None:
        """:meth:`add_request`'s work; returns the outputs of a request finished at once."""
        req = Request(request_id, list(prompt_token_ids), params,
                      arrival_time=time.perf_counter(), cache_salt=cache_salt)
        if params.prompt_logprobs is not None:  # every prompt token after the first
            req.num_scored_tokens = len(req.prompt_token_ids) - 1
            req.scored_top_logprobs = params.prompt_logprobs
        if questions is not None:
            return self._add_questions(req, questions)
        choice = is_choice(params)
        try:
            self._check_token_ids(req)
            if choice:
                prefill = self.choice_scores.add(req, self.scheduler.add_request)
            else:
                self.scheduler.add_request(req)
        except ValueError as e:
            return [self._error(req, str(e), i) for i in range(params.n)]
        self.counters.prompt_tokens += req.num_prompt_tokens
        if choice:
            self._unfinished[request_id] = params.n
            if self.choice_scores.waits_for_prefill(prefill):
                self.forks.expect([prefill])
            return None
        if req.max_tokens == 0:
            self.scheduler.finish_request(req, RequestStatus.FINISHED_LENGTH_CAPPED)
            return [self._output(req, "", i) for i in range(params.n)]
        self._unfinished[request_id] = params.n
        self._new_sample(req)
        if params.n > 1:
            self.forks.expect([req])
        return None

    def _add_questions(self, req: Request,
                       questions: tuple[QuestionPrompt, ...]) -> list[SampleOutput] | None:
        """Queue a question group (:meth:`add_request`), or its error output."""
        try:
            for q in questions:
                self._check_token_ids(Request(req.request_id, q.prompt_token_ids,
                                              req.sampling_params))
            waiting = self.question_scores.add(req, questions, self.scheduler.add_request)
        except ValueError as e:
            return [self._error(req, str(e))]
        self.counters.prompt_tokens += self.question_scores.num_prompt_tokens(req.request_id)
        self._unfinished[req.request_id] = 1
        self.forks.expect(waiting)
        return None

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        """Abort requests by the caller's id (vLLM's ``abort_request``): every request of
        each id, running or waiting (its ``n`` samples, those not forked yet, a choice row's
        scoring requests), finishes as aborted now, its blocks go back to the pool (full
        blocks stay in the prefix cache), and the runner frees its state at the next step
        (``SchedulerOutput.finished``). Their outputs are not returned.

        Args:
            request_ids: One id, or an iterable of ids; an unknown or finished id is ignored.
        """
        ids = {request_ids} if isinstance(request_ids, str) else set(request_ids)
        ids.intersection_update(self._unfinished)
        if not ids:
            return
        sched = self.scheduler
        for req in [r for r in (*sched.running, *sched.waiting) if r.request_id in ids]:
            sched.finish_request(req, RequestStatus.FINISHED_ABORTED)
            self._detok.pop(req.key, None)
        self.choice_scores.abort(ids)
        self.question_scores.abort(ids)
        self.forks.abort(ids)
        self._released = [o for o in self._released if o.request_id not in ids]
        for request_id in ids:
            del self._unfinished[request_id]

    def _check_token_ids(self, req: Request) -> None:
        """Raises ValueError naming the first id of the request outside the vocabulary
        (:func:`mlxpa.messages.request_token_id_problem`)."""
        params = req.sampling_params
        problem = request_token_id_problem(
            {"prompt_token_ids": req.prompt_token_ids, "stop_token_ids": params.stop_token_ids,
             "logit_bias": params.logit_bias}, self.runner.vocab_size)
        if problem is not None:
            raise ValueError(problem)

    def _error(self, req: Request, message: str, sample_index: int = 0) -> SampleOutput:
        req.status = RequestStatus.FINISHED_ABORTED
        out = self._output(req, "", sample_index)
        out.error = message
        return out

    def _new_sample(self, req: Request) -> None:
        """A decoded sample's detokenizer (and stop strings)."""
        p = req.sampling_params
        self._detok[req.key] = IncrementalDetokenizer(self.tokenizer, p.stop,
                                                      p.include_stop_str_in_output, p.min_tokens)

    def abort_unfinished(self) -> None:
        """Abort every request in flight (:meth:`abort_request` of every unfinished id: a
        caller that stopped reading :meth:`generate`, Ctrl-C in a notebook, a loop left
        early) and run the empty step in which the runner frees their state, so the next
        :meth:`generate` starts clean."""
        self.abort_request(list(self._unfinished))
        if self.scheduler.has_finished_requests():
            self.step()

    def _choice_scores(self) -> ChoiceScores:
        """Fresh bookkeeping of choice rows (none in flight)."""
        return ChoiceScores(self.tokenizer, self.scheduler.max_model_len, self.runner.seed_for,
                            self._output)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._released)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def step(self) -> list[SampleOutput]:
        """Run one scheduling step; return the samples that finished in it, and the new
        output of every running sample whose request asks for ``DELTA`` outputs
        (:mod:`mlxpa.engine.deltas`; ``SampleOutput.finished`` tells them apart)."""
        out = self.scheduler.schedule()
        self.counters.kv_pool_growths += out.num_kv_blocks > self.runner.num_blocks
        start = time.perf_counter()
        result = self.runner.execute(out)
        disk = self.kv_cache_manager.disk
        if disk is not None and out.total_num_scheduled_tokens >= 2 * len(out.requests) > 0:
            disk.observe_compute(time.perf_counter() - start, out.total_num_scheduled_tokens)
        if self.scheduler.spec_gate is not None:
            self.scheduler.spec_gate.observe_step(out, time.perf_counter() - start)
        updated = self._update(out, result)
        outputs = self._check_stops(updated, result.grammar_ended)
        for o in outputs:  # a request id is free again once its last sample is returned
            if o.finished:
                left = self._unfinished.pop(o.request_id, 1) - 1
                if left:
                    self._unfinished[o.request_id] = left
        return outputs

    def _update(self, out: SchedulerOutput, result: StepResult) -> list[Request]:
        """Fork what finished its prefill, keep the step's log-probabilities and scores,
        advance the scheduler, release the choice rows whose scores are complete, count;
        return the requests that received a token."""
        ran = {r.key: r for r in out.requests}
        for key, by_position in result.scored.items():
            if ran[key].sampling_params.prompt_logprobs is not None:
                ran[key].prompt_logprobs.update(by_position)
        if self.forks:
            self.forks.on_step(out)
        for key, lps in result.logprobs.items():
            ran[key].logprobs.extend(lps)
        self.counters.scored_tokens += (sum(map(len, result.scored.values()))
                                        + sum(map(len, result.targets.values())))
        self.counters.record_kv(out, self.kv_cache_manager, self.scheduler.running,
                                self.runner.block_bytes, self.runner.kv_storage.snapshot_bytes)
        if out.spec_token_ids:
            self.counters.spec.record(out, result.sampled)
        before = sum(r.num_output_tokens for r in out.requests)
        updated = self.scheduler.update_from_output(out, result.sampled, result.spec_token_ids)
        released = self.choice_scores.on_step(out, result)
        self.counters.generation_tokens += sum(len(o.token_ids) for o in released)
        self._released.extend(released)
        self.counters.record_step(sum(r.num_output_tokens for r in out.requests) - before,
                                  len(out.preempted), self.kv_cache_manager.evicted_blocks,
                                  result.mask_time_s)
        if self.kv_cache_manager.disk is not None:
            record_disk(self.counters, self.disk_store,
                        self.kv_cache_manager.disk.take_hit_tokens())
        return updated

    def _check_stops(self, updated: list[Request],
                     grammar_ended: dict[int, str | None]) -> list[SampleOutput]:
        """Stop strings and grammar endings of each request's new tokens; return the outputs
        of the requests that finished (and of those released since the last step), and the
        new output of each running ``DELTA`` request."""
        finished, self._released = self._released, []
        for req in updated:
            detok = self._detok[req.key]
            check_stop(req, detok, self.scheduler, grammar_ended)
            if req.is_finished:
                del self._detok[req.key]
                finished.append(final_delta(self._output(req, detok.finalize()), detok))
            elif wants_deltas(req):
                finished.append(step_delta(req, detok))
        return finished

    def _output(self, req: Request, text: str, sample_index: int | None = None) -> SampleOutput:
        out = sample_output(req, text, self.scheduler.eos_token_ids, sample_index)
        c = self.counters
        c.requests += 1
        if out.sample_index == 0:  # the prompt is counted once per row, as prompt_tokens is
            c.cached_prompt_tokens += out.num_cached_tokens
        if out.ttft_s is not None:
            c.ttft_s.append(out.ttft_s)
        c.itl_s.extend(out.itl_s)
        return out

    def generate(self, requests: Iterable[EngineRequest], max_waiting: int | None = None,
                 should_stop: Callable[[], bool] | None = None) -> Iterator[SampleOutput]:
        """Run every request to completion, yielding outputs as requests finish (and, for a
        ``DELTA`` request, after every step: :meth:`step`).

        Args:
            requests: Requests to run, pulled lazily (:meth:`add_request` each).
            max_waiting: Pull more requests only while fewer than this many wait
                (default: ``2 * max_num_seqs``).
            should_stop: Polled between steps; when it returns True, generation ends and
                the requests in flight stay unfinished (Ctrl-C).
        """
        limit = max_waiting or 2 * self.config.max_num_seqs
        it = iter(requests)
        exhausted = False
        while should_stop is None or not should_stop():
            while not exhausted and self.num_waiting < limit:
                request = next(it, None)
                if request is None:
                    exhausted = True
                    break
                self.add_request(*request)
            if not self.has_unfinished_requests():
                if exhausted:
                    if self.scheduler.has_finished_requests():
                        yield from self.step()  # the runner frees the last ones' state
                    return
                continue
            yield from self.step()
