"""Multi-model workloads: each model with its own rate, burstiness and on/off schedule.

A model's arrivals are a gamma process (Poisson at ``cv == 1``) on its own *on-time*
clock, which runs only while its schedule is on; mapping those times back to the wall
clock keeps the burstiness inside each on period and leaves the off periods empty, the
idle periods in which a tenant's weights can be lent to the others.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from shunter.engine.workload.arrivals import gamma_arrivals
from shunter.engine.workload.generate import build_workload
from shunter.engine.workload.lengths import LengthSampler, sharegpt_like
from shunter.engine.workload.requests import WorkloadRequest


@dataclass(frozen=True)
class OnOff:
    """On during ``[phase_s + k * period_s, phase_s + k * period_s + on_s)`` for
    ``k = 0, 1, ...``; off otherwise (also before ``phase_s``)."""

    period_s: float
    on_s: float
    phase_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.on_s <= self.period_s or self.phase_s < 0:
            raise ValueError(f"need 0 < on_s <= period_s and phase_s >= 0: {self}")

    def is_on(self, t: float) -> bool:
        if t < self.phase_s:
            return False
        return (t - self.phase_s) % self.period_s < self.on_s

    def on_time(self, duration_s: float) -> float:
        """Seconds of on-time in ``[0, duration_s)``."""
        span = max(0.0, duration_s - self.phase_s)
        full, rest = divmod(span, self.period_s)
        return full * self.on_s + min(rest, self.on_s)

    def wall_time(self, tau: float) -> float:
        """The wall time at which ``tau`` seconds of on-time have passed."""
        k = math.floor(tau / self.on_s)
        return self.phase_s + k * self.period_s + (tau - k * self.on_s)


@dataclass(frozen=True)
class ModelLoad:
    """One model's arrivals: ``rate`` requests per second while on, gaps with
    coefficient of variation ``cv``, lengths from ``lengths``; always on without a
    ``schedule``."""

    model: str
    rate: float
    cv: float = 1.0
    schedule: OnOff | None = None
    lengths: LengthSampler = field(default=sharegpt_like, compare=False)


def mixed_workload(
    loads: Sequence[ModelLoad], *, duration_s: float, seed: int
) -> list[WorkloadRequest]:
    """Every model's requests over ``duration_s`` seconds, by arrival time. About
    ``rate * on-time`` requests per model; each model draws from its own seeded
    generator, so adding a model leaves the others' requests unchanged."""
    requests: list[WorkloadRequest] = []
    for load in loads:
        rng = random.Random(f"{seed}:{load.model}")
        on = load.schedule
        span = duration_s if on is None else on.on_time(duration_s)
        taus = gamma_arrivals(load.rate, load.cv, round(load.rate * span), rng)
        times = [t for t in (taus if on is None else map(on.wall_time, taus)) if t < duration_s]
        requests += build_workload(times, load.lengths, load.model, rng)
    return sorted(requests, key=lambda r: (r.t, r.model))
