"""Open-loop arrival schedules: Poisson, or gamma with a burstiness, as ``vllm bench serve``.

Gaps between arrivals are gamma-distributed with shape ``burstiness`` and mean ``1 /
rate``: burstiness 1 is a Poisson process, below 1 burstier (inter-arrival CV =
1 / sqrt(burstiness) > 1), above 1 smoother. The draws are the simulator's
(``shunter.engine.workload.arrivals.gamma_arrivals``), so a seed gives the same arrivals
in both.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from shunter.engine.workload.arrivals import gamma_arrivals


@dataclass(frozen=True)
class ArrivalProcess:
    """Gamma-distributed gaps of shape ``burstiness`` (1: Poisson)."""

    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError(f"burstiness must be a positive number, not {self.burstiness}")

    @property
    def cv(self) -> float:
        """Coefficient of variation of the gaps: 1 / sqrt(burstiness)."""
        return 1.0 / math.sqrt(self.burstiness)

    def times(
        self,
        rate: float,
        rng: random.Random,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
    ) -> list[float]:
        """Arrival times in seconds from the start: ``num_requests`` of them, or every
        arrival before ``duration_s`` (exactly one of the two). An infinite ``rate``
        sends ``num_requests`` at once."""
        if (num_requests is None) == (duration_s is None):
            raise ValueError("give exactly one of num_requests and duration_s")
        if not rate > 0:
            raise ValueError(f"rate must be positive, not {rate}")
        if math.isinf(rate):
            if num_requests is None:
                raise ValueError("an infinite rate needs a number of requests, not a duration")
            return [0.0] * num_requests
        if num_requests is not None:
            if num_requests < 1:
                raise ValueError("num_requests must be at least 1")
            return gamma_arrivals(rate, self.cv, num_requests, rng)
        assert duration_s is not None
        if not duration_s > 0:
            raise ValueError("duration_s must be positive")
        # Draw in batches of the expected count until the schedule passes the end.
        times: list[float] = []
        batch = max(16, math.ceil(rate * duration_s * 1.1))
        while not times or times[-1] < duration_s:
            start = times[-1] if times else 0.0
            times += [start + t for t in gamma_arrivals(rate, self.cv, batch, rng)]
        return [t for t in times if t < duration_s]
