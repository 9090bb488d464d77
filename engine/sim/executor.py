"""SimulatedExecutor: forward steps timed by the cost model on the virtual clock."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from shunter.engine.interfaces import Executor
from shunter.engine.plan import StepPlan, StepResult
from shunter.engine.sim.clock import VirtualClock
from shunter.engine.sim.cost import SeqWork, StepCostModel
from shunter.engine.sim.transfers import SimulatedTransfers


@dataclass
class ExecutorTotals:
    """Everything the simulated device computed in a run."""

    steps: int = 0
    tokens: int = 0
    busy_s: float = 0.0
    stall_s: float = 0.0


class SimulatedExecutor(Executor):
    """Times each plan's forward pass with the per-model roofline and advances the clock.

    A step starts when it is executed, or later if a request in its batch was swapped in
    by an earlier plan whose H2D batch has not landed yet (that wait is a stall). It then
    takes the per-step overhead, the device-to-device moves (read and write at HBM
    bandwidth) and one forward pass per model in the batch. No tokens are real: every
    sampling entry emits ``None``, and requests end at their output length.
    """

    def __init__(
        self,
        clock: VirtualClock,
        costs: Mapping[str, StepCostModel],
        transfers: SimulatedTransfers,
        *,
        block_bytes: Mapping[str, int],
        step_overhead_s: float,
        hbm_bw: float,
    ) -> None:
        self._clock = clock
        self._costs = dict(costs)
        self._transfers = transfers
        self._block_bytes = dict(block_bytes)
        self._step_overhead_s = step_overhead_s
        self._hbm_bw = hbm_bw
        self._ready_at: dict[str, float] = {}
        self.totals = ExecutorTotals()

    def execute(self, plan: StepPlan) -> StepResult:
        t_called = self._clock.now()
        start = t_called
        for entry in plan.batch:
            ready = self._ready_at.pop(entry.request_id, None)
            if ready is not None:
                start = max(start, ready)
        h2d_done = self._transfers.pop_h2d_done(plan.step)
        if h2d_done is not None:
            # These join a later batch, once their blocks have landed.
            for request_id in plan.swapped_in:
                self._ready_at[request_id] = h2d_done
        for request_id in plan.released:
            self._ready_at.pop(request_id, None)

        work: dict[str, list[SeqWork]] = defaultdict(list)
        sampled: dict[str, int] = defaultdict(int)
        emitted: dict[str, int | None] = {}
        for entry in plan.batch:
            work[entry.model].append(SeqWork(entry.num_tokens, entry.num_computed_tokens))
            if entry.samples:
                sampled[entry.model] += 1
                emitted[entry.request_id] = None
        compute = sum(self._costs[m].forward_time(w, sampled[m]) for m, w in work.items())
        moved = sum(len(moves) * self._block_bytes[m] for m, moves in plan.moves.items())
        duration = 0.0
        if work or moved:
            duration = self._step_overhead_s + compute + 2 * moved / self._hbm_bw
        end = start + duration
        self._clock.advance_to(end)
        self.totals.steps += 1
        self.totals.tokens += plan.num_batch_tokens
        self.totals.busy_s += duration
        self.totals.stall_s += start - t_called
        return StepResult(duration_s=end - t_called, emitted=emitted)
