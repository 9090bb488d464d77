"""RotaSched's Largest-VLT-First (SuperInfer Algorithm 1)."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from shunter.engine.request import Request, vlts
from shunter.engine.sched.policy import Decision, Policy, PolicyInput, by_arrival


class LvfPolicy(Policy):
    """Largest-VLT-First, every step:

    1. Contention check: if the free device blocks hold every waiting and rotary
       request that can be admitted this step, admit in arrival order (FCFS) and stop.
    2. Sort all requests by VLT, descending.
    3. Prioritize: with ``left = free + B_xfer``, take non-running requests with
       VLT >= 0 from the head whose blocks fit in ``left``, at most as many as there
       are free running slots.
    4. Preempt: ``need = B_xfer - left``; from the tail, preempt running requests with
       VLT < 0 (whose KV host memory can take) until ``need`` blocks are freed.

    This is Algorithm 1 of the paper as long as the running cap leaves a slot for every
    candidate. When it does not, the cap, not HBM, limits admission, so LVF counts only
    what the free slots can take: the check looks at the FCFS head that fills them, and
    prioritization stops when they are full. Rotation then frees blocks for requests
    that will run, never slots: preempting a running request to hand its slot to
    another moves its KV both ways and adds no running request. With no free slot LVF
    falls back to FCFS and rotates nothing.

    Running requests have VLT <= 0 and the others VLT >= 0, so the sorted list is the
    non-running requests by VLT followed by the running ones by VLT; sorting the two
    groups apart gives the same order (Python's sort is stable) at lower cost. Each
    request's VLT is computed once per step.
    """

    name = "lvf"

    def schedule(self, state: PolicyInput) -> Decision:
        blk, free, slots = state.blk, state.num_free_blocks, state.num_free_slots
        candidates = [*state.waiting, *state.rotary]
        # The contention check, on what the free running slots can admit this step.
        if slots >= len(candidates):
            costs = state.blks(candidates)
            if free >= sum(costs):
                return Decision(admit=by_arrival(candidates))
        else:
            fcfs = by_arrival(candidates)
            if free >= sum(state.blks(fcfs[:slots])):
                return Decision(admit=fcfs)
            costs = state.blks(candidates)

        now = state.now
        head = sorted(range(len(candidates)), key=vlts(candidates, now).__getitem__, reverse=True)
        left = free + state.xfer_budget
        decision = Decision()
        for i in head:
            if left <= 0 or len(decision.admit) == slots:
                break
            if costs[i] <= left:  # every non-running VLT is >= 0
                decision.admit.append(candidates[i])
                left -= costs[i]

        need = state.xfer_budget - left
        for r in _tail_first(state.running, now):
            if need <= 0:
                break
            if state.can_rotate(r):
                decision.preempt.append(r)
                need -= blk(r)
        return decision


def _tail_first(running: Sequence[Request], now: float) -> list[Request]:
    """Running requests with VLT < 0 in reversed sorted order: smallest VLT first.

    VLT = -(now - t_run), so ascending VLT is ascending t_run; ties keep the reversed
    order of the stable descending sort. (Every running request has a ``t_run``.)
    """
    eligible = [r for r in running if r.t_run is not None and r.t_run < now]
    return sorted(reversed(eligible), key=attrgetter("t_run"))
