"""SimulatedExecutor: forward steps timed by the cost model on the virtual clock."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from shunter.engine.interfaces import Executor
from shunter.engine.plan import StepPlan, StepResult
from shunter.engine.sim.clock import VirtualClock
from shunter.engine.sim.cost import SeqWork, StepCostModel
from shunter.engine.sim.switch import SwitchCosts
from shunter.engine.sim.transfers import LinkCopy, SimulatedTransfers
from shunter.engine.sim.weights import WeightStreams


@dataclass
class ExecutorTotals:
    """Everything the simulated device computed in a run: ``stall_s`` waits for KV
    swap-ins; ``weight_stall_s`` waits for layers neither resident nor copied in time
    (``num_weight_stalls`` of them); ``weight_bytes`` copied host-to-device (slot
    prefetches and restored layers); ``switch_s`` paid for temporal model switches."""

    steps: int = 0
    tokens: int = 0
    busy_s: float = 0.0
    stall_s: float = 0.0
    weight_stall_s: float = 0.0
    num_weight_stalls: int = 0
    weight_bytes: int = 0
    switch_s: float = 0.0


class SimulatedExecutor(Executor):
    """Times each plan's forward pass with the per-model roofline and advances the clock.

    A step starts when it is executed, or later if a request in its batch was swapped in
    by an earlier plan whose H2D batch has not landed yet (that wait is a stall). It then
    takes the per-step overhead, the device-to-device moves (read and write at HBM
    bandwidth), a model switch if one is due, and one forward pass per model in the
    batch, one after another. No tokens are real: every sampling entry emits ``None``,
    and requests end at their output length.

    With ``weights``, each pass runs layer by layer (``WeightStreams``): the plan's
    restored layers are loaded when the plan arrives, and a model's streamed layers
    (``plan.streams``) wait for their slot copies. ``StepResult.compute_s`` reports each
    model's pass without those waits.
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
        weights: WeightStreams | None = None,
        switches: SwitchCosts | None = None,
    ) -> None:
        self._clock = clock
        self._costs = dict(costs)
        self._transfers = transfers
        self._block_bytes = dict(block_bytes)
        self._step_overhead_s = step_overhead_s
        self._hbm_bw = hbm_bw
        self._weights = weights
        self._switches = switches
        self._ready_at: dict[str, LinkCopy] = {}  # swapped in: the copy it waits for
        self.totals = ExecutorTotals()

    def execute(self, plan: StepPlan) -> StepResult:
        t_called = self._clock.now()
        start = t_called
        if self._weights is not None:
            # Issued before the batch's swap-ins are waited for: they share the link.
            for model, loads in plan.restored.items():
                layers = [load.layer for load in loads]
                self.totals.weight_bytes += self._weights.load(model, layers, t_called)
        for entry in plan.batch:
            copy = self._ready_at.pop(entry.request_id, None)
            if copy is not None:
                start = max(start, self._transfers.link.landed(copy))
        h2d = self._transfers.pop_h2d_done(plan.step)
        if h2d is not None:
            # These join a later batch, once their blocks have landed: when that is, the
            # link says then (copies issued in between may share it).
            for request_id in plan.swapped_in:
                self._ready_at[request_id] = h2d
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
        moved = sum(len(moves) * self._block_bytes[m] for m, moves in plan.moves.items())
        end = start
        compute_s: dict[str, float] = {}
        copy_s: dict[str, float] = {}
        if work or moved:
            switch = 0.0 if self._switches is None else self._switches.charge(work)
            self.totals.switch_s += switch
            end += self._step_overhead_s + 2 * moved / self._hbm_bw + switch
            for model, seqs in work.items():
                compute_s[model] = self._costs[model].forward_time(seqs, sampled[model])
                end, took = self._forward(plan, model, end, seqs, sampled[model], compute_s[model])
                if took is not None:
                    copy_s[model] = took
        self._clock.advance_to(end)
        self.totals.steps += 1
        self.totals.tokens += plan.num_batch_tokens
        self.totals.busy_s += end - start
        self.totals.stall_s += start - t_called
        return StepResult(
            duration_s=end - t_called, emitted=emitted, compute_s=compute_s, copy_s=copy_s
        )

    def _forward(
        self,
        plan: StepPlan,
        model: str,
        start: float,
        seqs: list[SeqWork],
        num_sampled: int,
        compute_s: float,
    ) -> tuple[float, float | None]:
        """When ``model``'s pass, started at ``start``, ends (its compute, plus waits
        for weights that are neither resident nor copied in time), and the mean time its
        layer copies took on the link (None without any)."""
        if self._weights is None:
            return start + compute_s, None
        cost = self._costs[model]
        head = cost.head_time(num_sampled)
        num_layers = cost.model.num_layers
        stream = plan.streams.get(model)
        timing = self._weights.run_pass(
            model,
            start,
            num_layers=num_layers,
            t_layer=(compute_s - head) / num_layers,
            t_head=head,
            streamed=stream.layers if stream else (),
            num_slots=len(stream.slots) if stream else 0,
        )
        self.totals.weight_stall_s += timing.stall_s
        self.totals.num_weight_stalls += timing.num_stalls
        self.totals.weight_bytes += timing.copied_bytes
        return timing.end, timing.copy_s
