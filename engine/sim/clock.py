"""The simulator's virtual clock."""

from __future__ import annotations

from shunter.engine.interfaces import Clock


class VirtualClock(Clock):
    """Simulated seconds since the start of a run; moves only when told to, never back."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        """Move to ``t`` if it is later than now (an earlier ``t`` changes nothing)."""
        self._now = max(self._now, t)
