"""Model switches under temporal sharing: what a turn passing costs the device.

The weights of a model that gets the turn are mostly resident already; what it has to
bring back (remapped layers) is timed by ``weights.WeightStreams``, and moving the
previous holder's KV out is the scheduler's rotation. What is left is a fixed cost per
switch: the executor swapping its per-model batch state and launch graphs. No public
figure exists for it; ``SWITCH_S`` is an assumption, and a knob.
"""

from __future__ import annotations

from collections.abc import Iterable

SWITCH_S = 1e-3


class SwitchCosts:
    """Charges ``switch_s`` the first time a temporal model executes after another
    temporal model did; counts switches."""

    def __init__(self, temporal: Iterable[str], switch_s: float = SWITCH_S) -> None:
        if switch_s < 0:
            raise ValueError("switch_s must be >= 0")
        self.temporal = frozenset(temporal)
        self.switch_s = switch_s
        self.num_switches = 0
        self._last: str | None = None

    def charge(self, models: Iterable[str]) -> float:
        """Seconds the step running ``models`` pays for switching."""
        cost = 0.0
        for model in models:
            if model in self.temporal and model != self._last:
                if self._last is not None:
                    cost += self.switch_s
                    self.num_switches += 1
                self._last = model
        return cost
