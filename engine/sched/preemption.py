"""Preempting a running request: its KV rotates out to host, or is dropped to recompute.

Passive preemption (a decode found no block, ``decodes``) and the policy's choices
(``admission``) both end here, so every preemption is carried out the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.plan import StepPlan
from shunter.engine.request import Request, RequestState
from shunter.engine.sched.queues import RequestQueues

ROTARY, WAITING = RequestState.ROTARY, RequestState.WAITING


def preempt(r: Request, plan: StepPlan, memory: KVMemory, q: RequestQueues, *, swap: bool) -> None:
    """RUNNING -> ROTARY with its KV swapped out (``q`` is ``r``'s model's queues);
    without KV worth keeping or host space for it, or without ``swap`` (``preemption =
    "recompute"``), RUNNING -> WAITING to recompute, its blocks freed. Counted on ``r``
    and listed in ``plan.preempted``."""
    r.num_preemptions += 1
    plan.preempted.append(r.id)
    if swap and r.num_computed_tokens and memory.can_swap_out(r):
        landed = memory.swap_out(r)
        q.move(r, ROTARY, landing=not landed)
        return
    memory.free(r)
    r.num_computed_tokens = 0
    q.move(r, WAITING)


class Preemptor:
    """Preemption for want of blocks, which the policy does not decide: a decode out of
    blocks (``Decodes``) and a floor given back (``Capacity.repay``). ``victim(running,
    now, step_s)`` picks the request to preempt among a model's running ones (the
    policy's ``passive_victim``), ``step_s()`` giving the last step's duration (None
    until a step has run); ``swap`` as for ``preempt``."""

    def __init__(
        self,
        memory: KVMemory,
        *,
        swap: bool,
        victim: Callable[[Iterable[Request], float, float | None], Request],
        step_s: Callable[[], float | None],
    ) -> None:
        self.memory = memory
        self.swap = swap
        self.victim = victim
        self.step_s = step_s

    def pick(self, running: Iterable[Request], now: float) -> Request:
        """The request to preempt among ``running`` (not empty)."""
        return self.victim(running, now, self.step_s())

    def preempt(self, r: Request, plan: StepPlan, q: RequestQueues) -> None:
        """``preempt`` with this engine's ``swap``."""
        preempt(r, plan, self.memory, q, swap=self.swap)
