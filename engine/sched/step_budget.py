"""StepBudget: the per-step token budget that keeps each step within a target time.

Pure logic: no torch. The scheduler asks it how many tokens the next step may batch;
after each step it is told how many tokens the step batched and how long it took, and,
where the executor measures them, each model's tokens and forward seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from shunter.engine.sched.step_cost import CostCurve

# Chunks below this many tokens cost more in per-step overhead than they save in step
# time: the budget never drops under it (with a target under the overhead, steps run
# over it rather than let a prompt crawl).
MIN_STEP_TOKENS = 32
# Before any step is measured: small enough that a first long prompt on a slow device
# does not hold the engine for seconds, large enough that the estimate sees a spread
# of batch sizes soon.
INITIAL_STEP_TOKENS = 256
# The weight of each new step in the estimate: about the last ten steps count.
EWMA_WEIGHT = 0.1
# A step whose least cost exceeds the target (each model's pass reads all of its weights,
# whatever the batch) may grow within this share of that least cost: on a GPU a pass
# costs its weight reads until its compute takes over (the roofline's knee), and below
# the knee its cost still creeps up with the tokens' attention, so "no dearer than the
# least step" must allow a margin or the step would stay at the least chunk.
FLAT_COST_MARGIN = 0.1
# A request sits a step out for another's only if it could wait this many steps: the
# one it sits out and the next, which it joins.
SLACK_STEPS = 2.0


@dataclass(frozen=True)
class StepShape:
    """What a step would batch: each model's ``tokens`` and ``num_seqs`` sequences."""

    tokens: Mapping[str, int]
    num_seqs: int


@dataclass
class StepBudget:
    """Tokens per step such that a step takes about ``target_s`` seconds.

    The cost model is ``duration = overhead_s + per_token_s * tokens``, fitted by least
    squares over the recent steps, each step weighing ``weight`` of the estimate and the
    older ones fading (an exponentially weighted moving fit, so the budget follows the
    device's load). Until the steps seen differ enough in size to separate the two terms,
    the whole cost is counted per token (overhead 0): a budget too small rather than
    too large; once they have, steps of one size keep the last fitted cost per token.
    ``tokens`` is ``(target_s - overhead_s) / per_token_s`` within
    ``[min_tokens, max_tokens]``; ``initial_tokens`` (within the same bounds) until a
    step is measured.

    Where the executor reports each model's pass (``observe``'s ``passes``), the budget
    of a step also knows what it runs (``tokens_for``): each model's pass costs what its
    ``CostCurve`` says for its tokens, and the rest of the step (host work per sequence,
    copies waited for) what a curve by sequences says. A step of several models may cost
    more than the target before any prompt token joins it (each pass reads its model's
    weights): such a step may then take as many tokens as keep it near the cost of its
    smallest passes, rather than the least chunk a line through all steps would allow.
    """

    target_s: float
    max_tokens: int
    min_tokens: int = MIN_STEP_TOKENS
    initial_tokens: int = INITIAL_STEP_TOKENS
    weight: float = EWMA_WEIGHT
    # Weighted moments of (tokens, duration): 1, n, n^2, d, n*d.
    _moments: list[float] = field(default_factory=lambda: [0.0] * 5, repr=False)
    _fit: tuple[float, float] | None = field(default=None, repr=False)
    _slope: float | None = field(default=None, repr=False)  # the last fitted per-token cost
    # Each model's pass by its tokens, and the rest of a step by its sequences.
    _curves: dict[str, CostCurve] = field(default_factory=dict, repr=False)
    _rest: CostCurve = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.target_s <= 0:
            raise ValueError("the step target must be positive")
        if not 0 < self.min_tokens <= self.max_tokens:
            raise ValueError("need 0 < min_tokens <= max_tokens")
        if not 0 < self.weight <= 1:
            raise ValueError("the weight must be in (0, 1]")
        self._rest = CostCurve(self.weight)

    def observe(
        self,
        num_tokens: int,
        duration_s: float,
        passes: Mapping[str, tuple[int, float]] | None = None,
        num_seqs: int = 0,
    ) -> None:
        """A step batched ``num_tokens`` tokens of ``num_seqs`` sequences in
        ``duration_s`` seconds, and ran each model of ``passes`` over ``(tokens,
        seconds of compute)``; steps that batched nothing (copies only) say nothing
        about the cost of tokens."""
        if num_tokens <= 0 or duration_s < 0:
            return
        n, d, w = float(num_tokens), duration_s, self.weight
        for i, x in enumerate((1.0, n, n * n, d, n * d)):
            self._moments[i] += w * (x - self._moments[i])
        self._fit = self._refit()
        if not passes or num_seqs <= 0:
            return
        for model, (tokens, seconds) in passes.items():
            self._curves.setdefault(model, CostCurve(w)).observe(tokens, seconds)
        rest = max(0.0, duration_s - sum(seconds for _, seconds in passes.values()))
        self._rest.observe(num_seqs, rest)

    def tokens_for(self, shape: Callable[[int], StepShape]) -> int:
        """The token budget of a step that would batch ``shape(total)`` for a budget of
        ``total`` tokens: the most tokens whose estimated step takes at most the target,
        or, where the step of each model's smallest pass is longer, at most
        ``FLAT_COST_MARGIN`` longer than that; at least ``min_tokens``. A step's
        estimate is each model's pass (its ``CostCurve``) plus the rest of the step for
        its sequences (host work: scheduling, sampling, delivery). ``tokens`` while a
        model of it has no measured pass."""
        whole = shape(self.max_tokens)
        models = [m for m, n in whole.tokens.items() if n > 0]
        curves, rest = self._curves, self._rest
        if not models or not rest.is_measured or not set(models) <= curves.keys():
            return self.tokens

        def estimate(planned: StepShape) -> float:
            passes = (curves[m].seconds(n) for m, n in planned.tokens.items() if n > 0)
            return rest.seconds(planned.num_seqs) + math.fsum(passes)

        def step_s(total: int) -> float:
            return estimate(shape(total))

        least = rest.least_s + math.fsum(curves[m].least_s for m in models)
        allowed = max(self.target_s, (1 + FLAT_COST_MARGIN) * least)
        # ``whole`` is the step at ``high`` too: every token it could batch, or all
        # ``max_tokens``.
        low, high = self.min_tokens, min(self.max_tokens, sum(whole.tokens.values()))
        if high <= low or estimate(whole) <= allowed:
            return max(low, high)
        while low < high:  # the largest total within ``allowed`` (step_s never decreases)
            mid = (low + high + 1) // 2
            low, high = (mid, high) if step_s(mid) <= allowed else (low, mid - 1)
        return low

    @property
    def per_token_s(self) -> float | None:
        """The estimated seconds per batched token; None before any step."""
        return None if self._fit is None else self._fit[1]

    @property
    def overhead_s(self) -> float | None:
        """The estimated fixed seconds of a step; None before any step."""
        return None if self._fit is None else self._fit[0]

    @property
    def tokens(self) -> int:
        """The token budget of the next step."""
        if self._fit is None:
            want = self.initial_tokens
        else:
            overhead, per_token = self._fit
            want = int((self.target_s - overhead) / per_token)
        return max(self.min_tokens, min(self.max_tokens, want))

    def _refit(self) -> tuple[float, float]:
        s0, s1, s2, sd, snd = self._moments
        mean_n, mean_d = s1 / s0, sd / s0
        var = s2 / s0 - mean_n * mean_n
        # Sizes must spread by a few tokens and a tenth of their mean, or noise in the
        # durations decides the slope.
        if var > max(16.0, (0.1 * mean_n) ** 2):
            slope = (snd / s0 - mean_n * mean_d) / var
            if slope > 0:
                self._slope = slope
                # A negative intercept is noise around an overhead of about 0.
                return max(0.0, mean_d - slope * mean_n), slope
        if self._slope is not None:
            # Steps of one size (a run of decodes) cannot tell the terms apart: keep the
            # cost per token last fitted and let the overhead follow the steps. Without
            # it, a run of one-token decode steps would price every token at a whole
            # step, and the next prompt would crawl in least chunks.
            return max(0.0, mean_d - self._slope * mean_n), self._slope
        return 0.0, max(mean_d / mean_n, 1e-9)
