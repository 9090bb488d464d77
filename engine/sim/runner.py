"""Run a workload through the real EngineCore on simulated hardware."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from shunter.engine.config import (
    EngineConfig,
    ModelSpec,
    RemapConfig,
    RotationConfig,
    SchedulerConfig,
    SloSpec,
    TenantSpec,
)
from shunter.engine.core import EngineCore
from shunter.engine.liveness import NoProgress, ProgressWatch
from shunter.engine.remap.timing import LayerTiming
from shunter.engine.request import Request
from shunter.engine.sim.clock import VirtualClock
from shunter.engine.sim.cost import CopyBatch, CopyCostModel, SeqWork, StepCostModel
from shunter.engine.sim.executor import SimulatedExecutor
from shunter.engine.sim.hardware import GB, HardwareProfile
from shunter.engine.sim.metrics import RequestRecord
from shunter.engine.sim.switch import SWITCH_S, SwitchCosts
from shunter.engine.sim.transfers import SimulatedTransfers
from shunter.engine.sim.weights import WeightStreams
from shunter.engine.workload.requests import WorkloadRequest

# The prefill a model runs first when it becomes active, for the prior of T_prefill:
# prompts of this many tokens filling the step's token budget. Measured passes replace
# it as the model runs.
PRIOR_PROMPT_TOKENS = 512


@dataclass(frozen=True)
class SimConfig:
    """One simulated engine: models, hardware, SLO class and knobs.

    The device arena is ``gpu_memory_utilization`` of HBM (vLLM's default share, 0.9);
    the host swap space is host memory less ``host_reserve_bytes`` (SuperInfer §5.2
    keeps 80 GB of Grace's 480 GB for the OS and runtime and swaps into 400 GB).
    ``swap_bandwidth_scale`` scales every copy bandwidth (the "w/o DuplexKV" ablation).
    ``tenants`` and ``remap`` go to the engine as they are (a tenant's SLO class is its
    requests'); ``switch_s`` is the fixed cost of a temporal model switch.
    ``xfer_budget_from_link``: B_xfer is not the scheduler's fixed figure but what the
    link moves within a step, each step (``link_xfer_blocks`` of the previous step's
    duration, less the weight copies that step made over the same link); the
    scheduler's figure is only the first step's.
    """

    models: tuple[ModelSpec, ...]
    hardware: HardwareProfile
    slo: SloSpec
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    rotation: RotationConfig = field(default_factory=RotationConfig)
    swap_bandwidth_scale: float = 1.0
    gpu_memory_utilization: float = 0.9
    host_reserve_bytes: float = 80 * GB
    block_tokens: int = 16
    tenants: tuple[TenantSpec, ...] = ()
    remap: RemapConfig = field(default_factory=RemapConfig)
    switch_s: float = SWITCH_S
    check_integrity: bool = False
    xfer_budget_from_link: bool = False

    def engine_config(self) -> EngineConfig:
        hw = self.hardware
        return EngineConfig(
            models=self.models,
            device_bytes=int(hw.hbm_bytes * self.gpu_memory_utilization),
            host_swap_bytes=int(max(0.0, hw.host_bytes - self.host_reserve_bytes)),
            block_tokens=self.block_tokens,
            scheduler=self.scheduler,
            rotation=self.rotation,
            tenants=self.tenants,
            remap=self.remap,
            check_integrity=self.check_integrity,
        )

    def layer_timings(self, copies: CopyCostModel) -> dict[str, LayerTiming]:
        """T_T of each model from the copy model (one layer, one copy), and priors of
        its forward times from the cost model: a decode of one request at 512 tokens
        of context, and a prefill step of ``PRIOR_PROMPT_TOKENS``-token prompts filling
        the token budget."""
        timings = {}
        num_prompts = max(1, self.scheduler.max_batch_tokens // PRIOR_PROMPT_TOKENS)
        for m in self.models:
            cost = StepCostModel(m, self.hardware)
            timings[m.name] = LayerTiming(
                t_transfer=copies.one_way_time(CopyBatch(((1, m.layer_bytes),))),
                t_decode=cost.forward_time([SeqWork(1, 512)], 1),
                t_prefill=cost.forward_time(
                    [SeqWork(PRIOR_PROMPT_TOKENS, 0)] * num_prompts, num_prompts
                ),
            )
        return timings


@dataclass(frozen=True)
class SimRun:
    """The outcome of one simulated run. Times are simulated seconds except ``wall_s``.

    ``records`` are in arrival order, ``record_models`` their models. ``rotations``
    counts preemptions (requests moved off the device); bytes count KV blocks copied
    each way. Peak HBM is weights plus KV blocks in use; peak host is KV bytes in the
    swap space. ``stall_s`` is time waiting for KV swap-ins.

    Remapping: ``remapped`` lists ``(time, layers remapped per model)`` whenever the
    counts change; ``weight_bytes`` are weights copied host-to-device (slot prefetches
    and restored layers); ``weight_stall_s`` is time waiting for layers not copied in
    time (``num_weight_stalls`` layers); ``num_switches`` counts temporal model switches.
    ``peak_xfer_budget_blocks`` is the largest B_xfer of any step (the fixed one unless
    it came from the link).
    """

    records: list[RequestRecord]
    record_models: list[str]
    sim_duration_s: float
    wall_s: float
    num_steps: int
    rotations: int
    d2h_bytes: int
    h2d_bytes: int
    peak_hbm_bytes: int
    peak_host_bytes: int
    stall_s: float
    remapped: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    weight_bytes: int = 0
    weight_stall_s: float = 0.0
    num_weight_stalls: int = 0
    num_switches: int = 0
    peak_xfer_budget_blocks: int = 0


class StuckError(NoProgress):
    """The engine has live requests but makes no progress: nothing will change, or no
    token has been emitted within the liveness invariant's limits (``liveness``)."""


def rotation_rate(copies: CopyCostModel, block_bytes: int) -> float:
    """Bytes per second one direction moves while the other moves as much (a rotation
    swaps out and in): the link's rate for ``block_bytes`` segments and, where host
    memory is shared by both directions (Grace's DRAM), at most half of it."""
    rate = copies.segment_bandwidth(block_bytes)
    shared = copies.hardware.host_mem_bw
    if shared is not None:
        rate = min(rate, shared * copies.bandwidth_scale / 2)
    return rate


def link_xfer_blocks(
    copies: CopyCostModel, block_bytes: int, seconds: float, *, weight_bytes: int = 0
) -> int:
    """B_xfer the link allows in ``seconds``: blocks of ``block_bytes`` at the
    ``rotation_rate``, less ``weight_bytes`` of weight copies on the same link."""
    room = rotation_rate(copies, block_bytes) * seconds - weight_bytes
    return max(0, int(room // block_bytes))


def simulate(config: SimConfig, workload: Sequence[WorkloadRequest]) -> SimRun:
    """Run ``workload`` to completion: every request finishes (or the run raises). A
    request too large for the engine ever to hold is rejected and counts as failed."""
    wall_start = time.perf_counter()
    engine_config = config.engine_config()
    clock = VirtualClock()
    hw = config.hardware
    block_bytes = {m.name: engine_config.block_bytes(m.name) for m in config.models}
    copies = CopyCostModel(hw, bandwidth_scale=config.swap_bandwidth_scale)
    # The scheduler counts B_xfer in blocks of the largest block size.
    largest_block = max(block_bytes.values())
    if engine_config.scheduler.link_bytes_per_s is None:
        # The scheduler knows what the link moves (lvf+ keeps a request running at
        # least as long as its KV's round trip takes).
        scheduler = dataclasses.replace(
            engine_config.scheduler, link_bytes_per_s=rotation_rate(copies, largest_block)
        )
        engine_config = dataclasses.replace(engine_config, scheduler=scheduler)
    transfers = SimulatedTransfers(clock, copies, block_bytes)
    timings = config.layer_timings(copies)
    weights = None
    if config.remap.enabled:
        weights = WeightStreams(
            {m: t.t_transfer for m, t in timings.items()},
            {m.name: m.layer_bytes for m in config.models},
            link=transfers.link,  # one link: weight copies and KV swap-ins share it
        )
    temporal = [t.model for t in engine_config.tenants if t.sharing == "temporal"]
    executor = SimulatedExecutor(
        clock,
        {m.name: StepCostModel(m, hw) for m in config.models},
        transfers,
        block_bytes=block_bytes,
        step_overhead_s=hw.step_overhead_s,
        hbm_bw=hw.hbm_bw,
        weights=weights,
        switches=SwitchCosts(temporal, config.switch_s),
    )
    # The liveness invariant, in simulated seconds and in steps (a livelock may stop the
    # virtual clock): the engine checks it after every step; StuckError when it fails.
    core = EngineCore(
        engine_config, executor, transfers, clock, timings=timings, progress=ProgressWatch()
    )
    weight_bytes = sum(m.param_bytes for m in config.models)
    layer_bytes = {m.name: m.layer_bytes for m in config.models}
    tenants = engine_config.tenant_by_model

    requests = [
        Request(
            id=str(i),
            model=w.model,
            prompt_tokens=w.prompt_tokens,
            max_output_tokens=w.output_tokens,
            slo=tenants[w.model].slo or config.slo,
            t_arr=w.t,
        )
        for i, w in enumerate(sorted(workload, key=lambda w: w.t))
    ]
    next_arrival = 0
    num_steps = rotations = d2h = h2d = peak_hbm = peak_host = 0
    peak_budget = config.scheduler.xfer_budget_blocks
    remapped: list[tuple[float, dict[str, int]]] = []
    turn: str | None = None
    while True:
        now = clock.now()
        while next_arrival < len(requests) and requests[next_arrival].t_arr <= now:
            try:
                core.add_request(requests[next_arrival])
            except ValueError:
                # It can never fit this engine's KV memory: rejected, a failed request.
                requests[next_arrival].aborted = True
            next_arrival += 1
        if core.is_idle():
            if next_arrival == len(requests):
                break
            clock.advance_to(requests[next_arrival].t_arr)
            continue
        weights_before = executor.totals.weight_bytes
        try:
            stats = core.step()
        except NoProgress as e:
            raise StuckError(str(e)) from None
        num_steps += 1
        if config.xfer_budget_from_link:
            # Weight copies share the host-to-device link (remapped layers streamed into
            # slots, restored layers): what they took last step is not there for KV.
            step_weight_bytes = executor.totals.weight_bytes - weights_before
            core.scheduler.set_xfer_budget(
                link_xfer_blocks(
                    copies, largest_block, stats.duration_s, weight_bytes=step_weight_bytes
                )
            )
        peak_budget = max(peak_budget, core.scheduler.config.xfer_budget_blocks)
        rotations += stats.num_preempted
        d2h += stats.d2h_bytes
        h2d += stats.h2d_bytes
        kv = sum(n * block_bytes[m] for m, n in stats.device_kv_blocks_used.items())
        lent = sum(n * layer_bytes[m] for m, n in stats.remapped_layers.items())
        peak_hbm = max(peak_hbm, weight_bytes - lent + kv)
        peak_host = max(peak_host, stats.host_bytes_used)
        last = remapped[-1][1] if remapped else dict.fromkeys(stats.remapped_layers, 0)
        remapping = stats.remapped_layers != last
        if remapping:
            remapped.append((stats.t_end, stats.remapped_layers))
        turned, turn = stats.turn != turn, stats.turn
        if stats.num_batch_tokens == 0:
            # Nothing computed, so time moves only to the next event: an arrival or a
            # copy completing. Without one, only a plan that changed state may go on.
            events = [t for t in (transfers.next_completion(),) if t is not None]
            if next_arrival < len(requests):
                events.append(requests[next_arrival].t_arr)
            if events:
                clock.advance_to(min(events))
            elif core.num_live and not (
                stats.num_swapped_in
                or stats.num_preempted
                or stats.num_admitted
                or remapping
                or turned
            ):
                raise StuckError(f"step {stats.step}: {core.num_live} live requests, no work")

    return SimRun(
        records=[
            RequestRecord.from_token_times(r.t_arr, r.token_times, success=not r.aborted)
            for r in requests
        ],
        record_models=[r.model for r in requests],
        sim_duration_s=clock.now(),
        wall_s=time.perf_counter() - wall_start,
        num_steps=num_steps,
        rotations=rotations,
        d2h_bytes=d2h,
        h2d_bytes=h2d,
        peak_hbm_bytes=peak_hbm,
        peak_host_bytes=peak_host,
        stall_s=executor.totals.stall_s,
        remapped=remapped,
        weight_bytes=executor.totals.weight_bytes,
        weight_stall_s=executor.totals.weight_stall_s,
        num_weight_stalls=executor.totals.num_weight_stalls,
        num_switches=core.scheduler.tenancy.num_switches,
        peak_xfer_budget_blocks=peak_budget,
    )
