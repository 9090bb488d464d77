"""Run a workload through the real EngineCore on simulated hardware."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from shunter.engine.config import (
    EngineConfig,
    ModelSpec,
    RotationConfig,
    SchedulerConfig,
    SloSpec,
)
from shunter.engine.core import EngineCore
from shunter.engine.request import Request
from shunter.engine.sim.clock import VirtualClock
from shunter.engine.sim.cost import CopyCostModel, StepCostModel
from shunter.engine.sim.executor import SimulatedExecutor
from shunter.engine.sim.hardware import GB, HardwareProfile
from shunter.engine.sim.metrics import RequestRecord
from shunter.engine.sim.transfers import SimulatedTransfers
from shunter.engine.sim.workload import WorkloadRequest


@dataclass(frozen=True)
class SimConfig:
    """One simulated engine: models, hardware, SLO class and knobs.

    The device arena is ``gpu_memory_utilization`` of HBM (vLLM's default share, 0.9);
    the host swap space is host memory less ``host_reserve_bytes`` (SuperInfer §5.2
    keeps 80 GB of Grace's 480 GB for the OS and runtime and swaps into 400 GB).
    ``swap_bandwidth_scale`` scales every copy bandwidth (the "w/o DuplexKV" ablation).
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
    check_integrity: bool = False

    def engine_config(self) -> EngineConfig:
        hw = self.hardware
        return EngineConfig(
            models=self.models,
            device_bytes=int(hw.hbm_bytes * self.gpu_memory_utilization),
            host_swap_bytes=int(max(0.0, hw.host_bytes - self.host_reserve_bytes)),
            block_tokens=self.block_tokens,
            scheduler=self.scheduler,
            rotation=self.rotation,
            check_integrity=self.check_integrity,
        )


@dataclass(frozen=True)
class SimRun:
    """The outcome of one simulated run. Times are simulated seconds except ``wall_s``.

    ``records`` are in arrival order. ``rotations`` counts preemptions (requests moved
    off the device); bytes count KV blocks copied each way. Peak HBM is weights plus KV
    blocks in use; peak host is KV bytes in the swap space.
    """

    records: list[RequestRecord]
    sim_duration_s: float
    wall_s: float
    num_steps: int
    rotations: int
    d2h_bytes: int
    h2d_bytes: int
    peak_hbm_bytes: int
    peak_host_bytes: int
    stall_s: float


class StuckError(RuntimeError):
    """The engine has live requests but can make no progress and nothing will change."""


def simulate(config: SimConfig, workload: Sequence[WorkloadRequest]) -> SimRun:
    """Run ``workload`` to completion: every request finishes (or the run raises)."""
    wall_start = time.perf_counter()
    engine_config = config.engine_config()
    clock = VirtualClock()
    hw = config.hardware
    block_bytes = {m.name: engine_config.block_bytes(m.name) for m in config.models}
    transfers = SimulatedTransfers(
        clock, CopyCostModel(hw, bandwidth_scale=config.swap_bandwidth_scale), block_bytes
    )
    executor = SimulatedExecutor(
        clock,
        {m.name: StepCostModel(m, hw) for m in config.models},
        transfers,
        block_bytes=block_bytes,
        step_overhead_s=hw.step_overhead_s,
        hbm_bw=hw.hbm_bw,
    )
    core = EngineCore(engine_config, executor, transfers, clock)
    weight_bytes = sum(m.param_bytes for m in config.models)

    requests = [
        Request(
            id=str(i),
            model=w.model,
            prompt_tokens=w.prompt_tokens,
            max_output_tokens=w.output_tokens,
            slo=config.slo,
            t_arr=w.t,
        )
        for i, w in enumerate(sorted(workload, key=lambda w: w.t))
    ]
    next_arrival = 0
    num_steps = rotations = d2h = h2d = peak_hbm = peak_host = 0
    while True:
        now = clock.now()
        while next_arrival < len(requests) and requests[next_arrival].t_arr <= now:
            core.add_request(requests[next_arrival])
            next_arrival += 1
        if core.is_idle():
            if next_arrival == len(requests):
                break
            clock.advance_to(requests[next_arrival].t_arr)
            continue
        stats = core.step()
        num_steps += 1
        rotations += stats.num_preempted
        d2h += stats.d2h_bytes
        h2d += stats.h2d_bytes
        kv = sum(n * block_bytes[m] for m, n in stats.device_kv_blocks_used.items())
        peak_hbm = max(peak_hbm, weight_bytes + kv)
        peak_host = max(peak_host, stats.host_bytes_used)
        if stats.num_batch_tokens == 0:
            # Nothing computed, so time moves only to the next event: an arrival or a
            # copy completing. Without one, only a plan that changed state may go on.
            events = [t for t in (transfers.next_completion(),) if t is not None]
            if next_arrival < len(requests):
                events.append(requests[next_arrival].t_arr)
            if events:
                clock.advance_to(min(events))
            elif not (stats.num_swapped_in or stats.num_preempted or stats.num_admitted):
                raise StuckError(f"step {stats.step}: {core.num_live} live requests, no work")

    return SimRun(
        records=[
            RequestRecord.from_token_times(r.t_arr, r.token_times, success=not r.aborted)
            for r in requests
        ],
        sim_duration_s=clock.now(),
        wall_s=time.perf_counter() - wall_start,
        num_steps=num_steps,
        rotations=rotations,
        d2h_bytes=d2h,
        h2d_bytes=h2d,
        peak_hbm_bytes=peak_hbm,
        peak_host_bytes=peak_host,
        stall_s=executor.totals.stall_s,
    )
