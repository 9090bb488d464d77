"""CostCurve: one model's forward-pass seconds as a function of the tokens it batches,
learned from its measured passes.

Pure logic: no torch. A step that runs several models pays for each model's pass, and a
pass's cost is not a line through the origin or any one line: on a GPU a pass reads all
of its model's weights whatever the batch, so a pass of a few tokens costs about what a
pass of a few hundred does (the flat part of a roofline), and only past that does the
cost grow with the tokens. One line fitted over whole steps of one, two or three models
holds none of these; a curve per model can.

Pass sizes are grouped in powers of two; each group keeps an exponentially weighted mean
of its passes' tokens and seconds. Between the groups' points the curve interpolates
linearly and never decreases; below the smallest point it is that point's cost; beyond
the largest it follows the last segment's slope (with one point, the whole cost counted
per token, which errs large), up to ``EXPLORE_FACTOR`` times the largest size measured
and no further (infinite). Without that bound a curve measured flat so far (decodes and
short prompts, all below a GPU's knee, or noise on a CPU) would price a fresh engine's
first long prompt at the flat cost and run it in one step of any length. The bound has a
price: a model's first long prompts come in chunks that double, each a whole step of its
weight reads.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

# How far past the largest pass it has measured a curve extrapolates: one doubling.
EXPLORE_FACTOR = 2.0


@dataclass
class CostCurve:
    """Seconds of one model's pass over ``n`` batched tokens (``seconds``)."""

    weight: float
    # log2 group -> [mean tokens, mean seconds], each an EWMA with ``weight``.
    _groups: dict[int, list[float]] = field(default_factory=dict, repr=False)
    _points: tuple[list[float], list[float]] | None = field(default=None, repr=False)

    def observe(self, tokens: int, seconds: float) -> None:
        """A pass batched ``tokens`` tokens in ``seconds`` of compute."""
        if tokens <= 0 or seconds < 0:
            return
        group = self._groups.get(tokens.bit_length())
        if group is None:
            self._groups[tokens.bit_length()] = [float(tokens), seconds]
        else:
            group[0] += self.weight * (tokens - group[0])
            group[1] += self.weight * (seconds - group[1])
        self._points = None

    @property
    def is_measured(self) -> bool:
        return bool(self._groups)

    @property
    def least_s(self) -> float:
        """The cost of the smallest pass measured (0 before any)."""
        ys = self._curve()[1]
        return ys[0] if ys else 0.0

    def seconds(self, tokens: int) -> float:
        """The estimated seconds of a pass over ``tokens`` tokens: 0 for none, infinite
        before any pass and past one doubling of the largest."""
        if tokens <= 0:
            return 0.0
        xs, ys = self._curve()
        if not xs or tokens > EXPLORE_FACTOR * xs[-1]:
            return math.inf
        if tokens <= xs[0]:
            return ys[0]
        i = bisect.bisect_left(xs, tokens)
        if i < len(xs):
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
        if len(xs) == 1:
            return ys[0] * tokens / xs[0]
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + slope * (tokens - xs[-1])

    def _curve(self) -> tuple[list[float], list[float]]:
        """The groups' points by size (a group's mean stays within its power of two,
        so sizes rise), each cost at least the one before (so the curve never
        decreases, whatever noise or a stale group says)."""
        if self._points is None:
            xs: list[float] = []
            ys: list[float] = []
            for _, (n, s) in sorted(self._groups.items()):
                xs.append(n)
                ys.append(max(s, ys[-1]) if ys else s)
            self._points = (xs, ys)
        return self._points
