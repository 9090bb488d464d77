"""FCFS: vLLM-like first-come-first-served with passive preemption only."""

from __future__ import annotations

from shunter.engine.sched.policy import Decision, Policy, PolicyInput, admit_fitting, by_arrival


class FcfsPolicy(Policy):
    """Waiting and rotary requests in arrival order, while their blocks fit.

    Nothing is preempted proactively: running requests lose their KV only when a
    decode needs a block and none is free (passive preemption). A preempted
    request keeps its arrival time, so it usually resumes before newer requests start.
    """

    name = "fcfs"

    def schedule(self, state: PolicyInput) -> Decision:
        candidates = by_arrival(state.waiting, state.rotary)
        return Decision(admit=admit_fitting(candidates, state.num_free_blocks, state.blk))
