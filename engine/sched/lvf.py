"""RotaSched's Largest-VLT-First (SuperInfer Algorithm 1)."""

from __future__ import annotations

from collections.abc import Sequence

from shunter.engine.request import Request, vlts
from shunter.engine.sched.policy import Decision, Policy, PolicyInput, by_arrival


class LvfPolicy(Policy):
    """Largest-VLT-First, every step:

    1. Contention check: if the free device blocks hold every waiting and rotary
       request, admit them all in arrival order (FCFS) and stop.
    2. Sort all requests by VLT, descending.
    3. Prioritize: with ``left = free + B_xfer``, take non-running requests with
       VLT >= 0 from the head whose blocks fit in ``left``.
    4. Preempt: ``need = B_xfer - left``; from the tail, preempt running requests with
       VLT < 0 (whose KV host memory can take) until ``need`` blocks are freed.

    Running requests have VLT <= 0 and the others VLT >= 0, so the sorted list is the
    non-running requests by VLT followed by the running ones by VLT; sorting the two
    groups apart gives the same order (Python's sort is stable) at lower cost. Each
    request's VLT is computed once per step.
    """

    name = "lvf"

    def schedule(self, state: PolicyInput) -> Decision:
        blk, free = state.blk, state.num_free_blocks
        candidates = [*state.waiting, *state.rotary]
        costs = state.blks(candidates)
        if free >= sum(costs):
            return Decision(admit=by_arrival(candidates))

        now = state.now
        head = sorted(range(len(candidates)), key=vlts(candidates, now).__getitem__, reverse=True)
        left = free + state.xfer_budget
        decision = Decision()
        for i in head:
            if left <= 0:
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


def _run_start(r: Request) -> float:
    assert r.t_run is not None
    return r.t_run


def _tail_first(running: Sequence[Request], now: float) -> list[Request]:
    """Running requests with VLT < 0 in reversed sorted order: smallest VLT first.

    VLT = -(now - t_run), so ascending VLT is ascending t_run; ties keep the reversed
    order of the stable descending sort.
    """
    eligible = [r for r in running if _run_start(r) < now]
    return sorted(reversed(eligible), key=_run_start)
