"""What the turns ask of the queues, and how a step ends the holder's turn.

The turn rules live in ``tenancy``; this is the Scheduler's side of them: which models
have work, how urgent each is (``Urgency``), and after a step's admissions, whether the turn
holder got anything done with it.
"""

from __future__ import annotations

from collections.abc import Mapping

from shunter.engine.plan import StepPlan
from shunter.engine.request import slo_slack
from shunter.engine.sched.queues import RequestQueues
from shunter.engine.sched.tenancy import Tenancy, Urgency


class Turns:
    """Turn inputs over the per-model ``queues`` for ``tenancy``."""

    def __init__(self, queues: Mapping[str, RequestQueues], tenancy: Tenancy) -> None:
        self.queues = queues
        self.tenancy = tenancy

    def has_work(self, model: str) -> bool:
        return len(self.queues[model]) > 0

    def urgency(self, now: float) -> Urgency:
        """From the SLO slack of every request of a model, whatever its state (a paused
        model's running requests lose slack as waiting ones do): whether one can still
        meet its SLO, and minus the least slack among those that can (else among all).
        Each answer is kept (the turn decision and the run-next order ask again): use it
        while the queues stay as they are."""
        known: dict[str, tuple[bool, float]] = {}

        def urgency(model: str) -> tuple[bool, float]:
            value = known.get(model)
            if value is None:
                q = self.queues[model]
                groups = (q.waiting, q.rotary, q.landing, q.running)
                slacks = [slo_slack(r, now) for g in groups for r in g.values()]
                in_time = [s for s in slacks if s >= 0.0]
                value = known[model] = (bool(in_time), -min(in_time or slacks))
            return value

        return urgency

    def end_step(
        self, executing: list[str], plan: StepPlan, sitting_out: set[str], now: float
    ) -> None:
        """After a step's admissions: a turn holder that executed and progressed has
        changed memory; one that could do nothing passes the turn on now."""
        holder = self.tenancy.holder
        if holder in executing:
            if self._progressed(holder, plan, sitting_out):
                self.tenancy.memory_changed()
            else:
                self.tenancy.pass_turn(now, self.has_work, self.urgency(now))  # queues changed

    def _progressed(self, model: str, plan: StepPlan, sitting_out: set[str]) -> bool:
        """Whether ``model`` computes, brings a request in, or waits for copies of its
        own this step."""
        q = self.queues[model]
        return (
            bool(q.landing)
            or any(e.model == model for e in plan.batch)
            or any(rid in q.running for rid in plan.swapped_in)
            or any(rid in q.running for rid in sitting_out)
        )
