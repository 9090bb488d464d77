"""How long a temporal turn lasts: the quantum follows the measured cost of a switch.

A switch costs the new holder time it does not compute: the wait before its first step
(its requests' KV swapped back in, the step under way finished) and the transfer waits
of its first steps (its lent layers streamed back, the old holder's KV rotated out).
``TurnLength`` measures that cost for each turn, from the switch until the holder's
first step without a wait (or the next switch), keeps a moving average, and sets the
quantum to ``k`` times it, so switching takes at most ``1 / (k + 1)`` of the temporal
models' time:

    quantum = clamp(k x switch cost, min_quantum_s, max_quantum_s)

``k`` = 4 (``SWITCH_COST_FACTOR``): at most a fifth of a turn lost to the switch, the
same bound on overhead as a time-slicing scheduler whose slice is four context switches
long. ``max_quantum_s`` keeps the turn short enough for the waiting tenants' TTFT: a
request that arrives as its model loses the turn waits for every other temporal model's
turn, so with n temporal models the turn is at most 1/n of the tightest TTFT target
among them (no bound when none has a class).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SWITCH_COST_FACTOR = 4.0
"""k: turn length over switch cost (at most 1/(k+1) of the time spent switching)."""

EWMA_WEIGHT = 0.3
"""Weight of the newest switch's cost in the moving average: a few switches adapt it."""

SETTLED_WAIT_FRACTION = 0.01
"""A step whose waits are under this share of its duration ends a switch's measure."""


@dataclass
class TurnLength:
    """The quantum, from the switch costs measured so far (none yet: ``min_quantum_s``).

    Call ``switched(now)`` when the turn moves to another model, and ``observe`` after
    each step with whether the holder executed in it, the step's duration and the
    compute in it (the executor's per-model forward passes; None where the executor
    does not say, when only the wait before the first step is counted).
    """

    min_quantum_s: float
    max_quantum_s: float | None = None
    k: float = SWITCH_COST_FACTOR
    t_switch_cost: float | None = None
    _t_switch: float | None = field(default=None, repr=False)
    _cost: float = field(default=0.0, repr=False)
    _ran: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        if self.min_quantum_s < 0:
            raise ValueError("min_quantum_s must be >= 0")

    @property
    def quantum_s(self) -> float:
        """The least time a holder with work keeps the turn now."""
        if self.t_switch_cost is None:
            return self.min_quantum_s
        quantum = max(self.min_quantum_s, self.k * self.t_switch_cost)
        if self.max_quantum_s is not None:
            quantum = min(quantum, max(self.min_quantum_s, self.max_quantum_s))
        return quantum

    @property
    def is_measuring(self) -> bool:
        """Whether a switch's cost is being measured (``observe`` has work to do)."""
        return self._t_switch is not None

    def switched(self, now: float) -> None:
        """The turn moved to another model at ``now``: a switch not yet settled is
        recorded with what it cost so far, and a new measure starts."""
        self._settle()
        self._t_switch, self._cost, self._ran = now, 0.0, False

    def observe(
        self, *, holder_ran: bool, now: float, duration_s: float, compute_s: float | None
    ) -> None:
        """A step of ``duration_s`` ended at ``now``."""
        if self._t_switch is None or not holder_ran:
            return
        if not self._ran:
            self._ran = True
            self._cost += max(0.0, now - duration_s - self._t_switch)
        wait = 0.0 if compute_s is None else max(0.0, duration_s - compute_s)
        self._cost += wait
        if compute_s is None or wait <= SETTLED_WAIT_FRACTION * duration_s:
            self._settle()

    def _settle(self) -> None:
        if self._t_switch is None or not self._ran:
            self._t_switch = None
            return
        cost, old = self._cost, self.t_switch_cost
        self.t_switch_cost = cost if old is None else (1 - EWMA_WEIGHT) * old + EWMA_WEIGHT * cost
        self._t_switch = None
