"""StepBudget: the per-step token budget that keeps each step within a target time.

Pure logic: no torch. The scheduler asks it how many tokens the next step may batch;
after each step it is told how many tokens the step batched and how long it took.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
# A request sits a step out for another's only if it could wait this many steps: the
# one it sits out and the next, which it joins.
SLACK_STEPS = 2.0


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

    def __post_init__(self) -> None:
        if self.target_s <= 0:
            raise ValueError("the step target must be positive")
        if not 0 < self.min_tokens <= self.max_tokens:
            raise ValueError("need 0 < min_tokens <= max_tokens")
        if not 0 < self.weight <= 1:
            raise ValueError("the weight must be in (0, 1]")

    def observe(self, num_tokens: int, duration_s: float) -> None:
        """A step batched ``num_tokens`` tokens in ``duration_s`` seconds; steps that
        batched nothing (copies only) say nothing about the cost of tokens."""
        if num_tokens <= 0 or duration_s < 0:
            return
        n, d, w = float(num_tokens), duration_s, self.weight
        for i, x in enumerate((1.0, n, n * n, d, n * d)):
            self._moments[i] += w * (x - self._moments[i])
        self._fit = self._refit()

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
