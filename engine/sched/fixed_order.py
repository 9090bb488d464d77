"""The static offloading policies of SuperInfer §3.1, each a fixed order of waiting and
swapped (rotary) requests: waiting-first and swapped-first."""

from __future__ import annotations

from shunter.engine.sched.policy import Decision, Policy, PolicyInput, admit_fitting


class WaitingFirstPolicy(Policy):
    """WF: new arrivals first, making room by preempting running requests.

    Waiting requests are taken in arrival order; when one does not fit, running
    requests are preempted, latest arrival first, within the step's transfer budget.
    Rotary requests resume only after every waiting request is admitted, and only into
    free blocks. Good for TTFT, bad for TBT (running requests sit out long).
    """

    name = "wf"

    def schedule(self, state: PolicyInput) -> Decision:
        free, budget, blk = state.num_free_blocks, state.xfer_budget, state.blk
        victims = sorted(filter(state.can_rotate, state.running), key=lambda r: r.t_arr)
        decision = Decision()
        for r in state.waiting:
            need = blk(r)
            while need > free and victims and blk(victims[-1]) <= budget:
                victim = victims.pop()
                decision.preempt.append(victim)
                free += blk(victim)
                budget -= blk(victim)
            if need > free:
                return decision
            decision.admit.append(r)
            free -= need
        decision.admit += admit_fitting(state.rotary, free, blk)
        return decision


class SwappedFirstPolicy(Policy):
    """SF: rotary requests resume first, in preemption order; waiting requests start
    only once none is left. Passive preemption only. Protects TBT, degrades toward
    FCFS on TTFT because swap space stays underused."""

    name = "sf"

    def schedule(self, state: PolicyInput) -> Decision:
        resumed = admit_fitting(state.rotary, state.num_free_blocks, state.blk)
        if len(resumed) < len(state.rotary):
            return Decision(admit=resumed)
        free = state.num_free_blocks - sum(map(state.blk, resumed))
        return Decision(admit=resumed + admit_fitting(state.waiting, free, state.blk))
