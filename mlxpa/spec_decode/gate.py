"""How many draft tokens a step verifies: the live batch, each row's recent acceptance and the
measured cost of a forward in its tokens decide it, so speculation never slows a workload.

A forward over ``M`` new tokens costs about ``a + b M`` seconds: ``a`` streams the weights,
``b`` is the matmul work per token. Verifying ``k`` drafts on each of ``B`` rows costs
``(r + B (k + 1)) / (r + B)`` times a plain decode step, ``r = a / b`` (measured on this
CPU for Gemma 3 270M: ``r`` about 21 tokens, so 16 rows at ``k = 1`` cost 1.4x). A row whose
drafts are accepted with probability ``p`` each emits ``1 + p + ... + p^k`` tokens on
average. The gate picks the ``k`` that maximises tokens per second over the decode rows
(vLLM's adaptive verification; Rapid-MLX's cooldown falls out of ``p``), 0 when no ``k``
beats plain decoding by :data:`MIN_GAIN`.
"""

from __future__ import annotations

import math
from collections import deque

# Cost ratio a / b (tokens) assumed until steps of different sizes were timed.
PRIOR_RATIO = 16.0
# Acceptance assumed for a row's first drafts, as prior counts (accepted, rejected); once the
# batch's rows have been verified at a higher rate, PRIOR_WEIGHT counts at that rate (never
# lower: a row's own rejections lower its estimate, other rows' never stop it drafting).
PRIOR_ACCEPTED, PRIOR_REJECTED = 1.0, 1.0
PRIOR_WEIGHT = 2.0
# Weight of all rows' earlier verifications after each new one (the prior's forgetting).
GLOBAL_DECAY = 0.98
# Weight of a row's earlier verifications after each new one (exponential forgetting).
DECAY = 0.8
# A fitted slope counts once it is this many standard errors above zero.
MIN_SLOPE_T = 3.0
# Speculate only when the best k gives at least this much more throughput than k = 0.
MIN_GAIN = 1.05


class StepCost:
    """The ratio ``r = a / b`` of a forward's cost ``a + b * tokens``, fitted by least squares
    over the last ``window`` timed steps; :data:`PRIOR_RATIO` until the fit can be trusted:
    at least 8 steps whose sizes span a factor of ``min_spread``, and a slope ``b`` at least
    :data:`MIN_SLOPE_T` standard errors above zero with a positive intercept.

    NOTE: a batch of 128 rows decodes at 120-128 tokens a step for most of a run; a slope
    fitted over sizes that close is mostly the steps' timing noise, and a slope near zero
    made ``r`` huge (every forward "weight-bound"), so the gate proposed and drafted at 128
    rows and an offline run of 128 rows lost 4-5 %.
    """

    def __init__(self, window: int = 256, min_spread: float = 2.0) -> None:
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)
        self.min_spread = min_spread

    def observe(self, tokens: int, seconds: float) -> None:
        """One step's forward tokens and its wall time."""
        if tokens > 0 and seconds > 0:
            self.samples.append((tokens, seconds))

    @property
    def ratio(self) -> float:
        """``a / b`` in tokens."""
        n = len(self.samples)
        if n < 8:
            return PRIOR_RATIO
        xs = [m for m, _ in self.samples]
        if max(xs) < self.min_spread * min(xs):
            return PRIOR_RATIO
        mx_ = sum(xs) / n
        my = sum(t for _, t in self.samples) / n
        sxx = sum((x - mx_) ** 2 for x in xs)
        b = sum((x - mx_) * (t - my) for x, (_, t) in zip(xs, self.samples)) / sxx
        a = my - b * mx_
        sse = sum((t - a - b * x) ** 2 for x, (_, t) in zip(xs, self.samples))
        se_b = math.sqrt(sse / (n - 2) / sxx)
        if a <= 0 or b <= MIN_SLOPE_T * se_b:
            return PRIOR_RATIO
        return min(a / b, 4096.0)


class SpecGate:
    """Draft tokens per step for the rows of a batch.

    Args:
        num_speculative_tokens: Most drafts per row (k).
        disable_by_batch_size: No drafts while more rows than this decode (None: no cap).
    """

    def __init__(self, num_speculative_tokens: int,
                 disable_by_batch_size: int | None = None) -> None:
        self.max_k = num_speculative_tokens
        self.disable_by_batch_size = disable_by_batch_size
        self.cost = StepCost()
        self._counts: dict[int, list[float]] = {}  # key -> [accepted, rejected], decayed
        self._all = [0.0, 0.0]  # every row's, decayed by GLOBAL_DECAY

    def _prior(self) -> tuple[float, float]:
        """Prior counts (accepted, rejected) of a row: the batch's recent rate once known, if
        above the fixed prior's."""
        acc, rej = self._all
        p = acc / (acc + rej) if acc + rej >= PRIOR_WEIGHT else 0.0
        if p <= PRIOR_ACCEPTED / (PRIOR_ACCEPTED + PRIOR_REJECTED):
            return PRIOR_ACCEPTED, PRIOR_REJECTED
        return PRIOR_WEIGHT * p, PRIOR_WEIGHT * (1 - p)

    def acceptance(self, key: int) -> float:
        """Estimated probability that a row's next draft token is accepted: its own recent
        verifications over a prior at every row's recent rate (at least 1/2)."""
        acc, rej = self._counts.get(key, (0.0, 0.0))
        pa, pr = self._prior()
        return (acc + pa) / (acc + rej + pa + pr)

    def observe(self, key: int, num_drafts: int, num_accepted: int) -> None:
        """A row verified ``num_drafts`` drafts and accepted the first ``num_accepted``."""
        if num_drafts <= 0:
            return
        c = self._counts.setdefault(key, [0.0, 0.0])
        c[0] = c[0] * DECAY + num_accepted
        c[1] = c[1] * DECAY + (num_accepted < num_drafts)
        g = self._all
        g[0] = g[0] * GLOBAL_DECAY + num_accepted
        g[1] = g[1] * GLOBAL_DECAY + (num_accepted < num_drafts)

    def observe_step(self, out, seconds: float) -> None:
        """Time scheduler step ``out`` (a ``SchedulerOutput``) into :attr:`cost` if it ran
        as one decode forward (every row one token or verifying drafts): its padded tokens."""
        counts = out.num_scheduled_tokens
        if counts and all(n == 1 or r.key in out.spec_token_ids
                          for r, n in zip(out.requests, counts)):
            self.cost.observe(len(counts) * max(counts), seconds)

    def forget(self, key: int) -> None:
        self._counts.pop(key, None)

    def num_drafts(self, rows: list[tuple[int, int]]) -> int:
        """The step's k for decode rows ``(key, drafts available)`` (all the step's decode
        rows, with or without drafts: the verify forward pads each to ``k + 1`` tokens).

        Returns:
            0 to ``num_speculative_tokens``: the best expected tokens per unit of cost, 0
            unless it beats plain decoding by :data:`MIN_GAIN`.
        """
        b = len(rows)
        top = max((d for _, d in rows), default=0)
        if not b or not top or (self.disable_by_batch_size is not None
                                and b > self.disable_by_batch_size):
            return 0
        return self._best_k([(self.acceptance(key), d) for key, d in rows if d], b, top)

    def worth_proposing(self, keys: list[int]) -> bool:
        """Whether rows ``keys`` (the next step's decode rows) could draft at all: some k
        would pay if every row had ``num_speculative_tokens`` drafts at its estimated
        acceptance. When not, the runner skips the proposer (its cost is per row)."""
        b = len(keys)
        if not b or (self.disable_by_batch_size is not None and b > self.disable_by_batch_size):
            return False
        return self._best_k([(self.acceptance(key), self.max_k) for key in keys], b,
                            self.max_k) > 0

    def _best_k(self, probs: list[tuple[float, int]], b: int, top: int) -> int:
        """The k of the best expected tokens per unit of cost for ``b`` decode rows, those
        with drafts being ``probs`` (acceptance, drafts available); 0 unless it beats plain
        decoding by :data:`MIN_GAIN`."""
        r = self.cost.ratio
        best_k, best = 0, b / (r + b)
        for k in range(1, min(self.max_k, top) + 1):
            tokens = b + sum(sum(p ** j for j in range(1, min(k, d) + 1)) for p, d in probs)
            rate = tokens / (r + b * (k + 1))
            if rate > best * (MIN_GAIN if best_k == 0 else 1.0):
                best_k, best = k, rate
        return best_k
