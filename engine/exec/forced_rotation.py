"""Forced rotation (``shunter generate --force-rotation``): rotate on every step it can.

A policy wrapper, pure logic: it makes KV rotation happen far more often than memory
pressure would, so that a short run exercises swap-out, landing and swap-in on every
request, and any difference from an unrotated run shows in the tokens.
"""

from __future__ import annotations

from shunter.engine.sched.policy import Decision, Policy, PolicyInput


class ForcedRotation(Policy):
    """``inner``'s decision, plus the preemption of every other running request that
    has run for at least one step since it last came onto the device and whose KV host
    memory can take.

    A request is never preempted in the step it starts or rejoins (its ``t_run`` is
    that step's time), so every request still computes one step per trip and the run
    ends: each trip is a step of compute, a swap-out, and a swap-in once the copies
    have landed.
    """

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = f"{inner.name}+forced-rotation"

    def schedule(self, state: PolicyInput) -> Decision:
        decision = self.inner.schedule(state)
        chosen = set(map(id, decision.preempt))
        decision.preempt += [
            r
            for r in state.running
            if id(r) not in chosen
            and r.t_run is not None
            and r.t_run < state.now
            and state.can_rotate(r)
        ]
        return decision
