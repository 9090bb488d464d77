"""Planning benchmarks: host time to plan one step.

``bench scheduler``: LVF against FCFS, by live requests, on one model.

The paper's setting (SuperInfer §5.1): Qwen2.5-32B on a 144 GB GH200, 90% of HBM for
the arena (about 15k KV blocks of 4 MiB after the weights), default knobs (B_xfer =
2400). Each run keeps ``num_live`` requests alive with ShareGPT-like lengths and lets all
of them run (``max_running = num_live``), so HBM, not the running cap, limits admission:
memory is contended from a few hundred requests on, LVF rotates up to B_xfer blocks
every step (the table shows how many it swapped in), FCFS preempts passively. (Under a
cap that binds first, LVF rotates for slots as well, within the same B_xfer.) The step loop is the
real EngineCore; the executor and transfer engine are instant stand-ins, since only
planning is timed (``StepStats.schedule_s``: policy, memory verbs, batch building, eager
rotation).

``bench remap``: eight tenants (four spatial, four temporal) on one GH200, parameter
remapping on, 1,024 live requests: the same planning time, now with tenancy and the
remapping controller (when, which model, how many, which layers, and the memory verbs
that lend and restore frames) inside it.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from shunter.engine.benchfigure import BenchFigure, ReportItem
from shunter.engine.catalog import CATALOG
from shunter.engine.config import (
    EngineConfig,
    RemapConfig,
    RotationConfig,
    SchedulerConfig,
    SloSpec,
    TenantSpec,
)
from shunter.engine.core import EngineCore, StepStats
from shunter.engine.interfaces import Clock, Executor, Transfers
from shunter.engine.plan import StepPlan, StepResult
from shunter.engine.request import Request
from shunter.engine.sim.cost import CopyCostModel
from shunter.engine.sim.hardware import gh200
from shunter.engine.sim.runner import SimConfig

MODEL = CATALOG["qwen2.5-32b"]  # a 16-token KV block is 4 MiB
DEVICE_BYTES = int(0.9 * 144e9)
SLO = SloSpec("bench", ttft_s=5.0, tbt_s=0.1)
STEP_S = 0.05  # virtual seconds per step, so VLTs move as in a busy engine
BLOCK_TOKENS = 16
REMAP_TARGET_MS = 1.5  # median planning time per step, with eight tenants and remapping


class _Clock(Clock):
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


class _InstantExecutor(Executor):
    """Samples a token for every entry that asks, in ``STEP_S`` of virtual time."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock

    def execute(self, plan: StepPlan) -> StepResult:
        self.clock.t += STEP_S
        return StepResult(STEP_S, {e.request_id: None for e in plan.batch if e.samples})


class _InstantTransfers(Transfers):
    """Every step's copies are done by the next poll."""

    def __init__(self) -> None:
        self.pending: list[int] = []

    def submit(self, plan: StepPlan) -> None:
        self.pending.append(plan.step)

    def poll(self, now: float) -> list[int]:
        done, self.pending = self.pending, []
        return done


@dataclass(frozen=True)
class BenchResult:
    """Median planning time per step, and the mean blocks swapped in per timed step."""

    policy: str
    num_live: int
    median_s: float
    steps: int
    h2d_blocks_per_step: float


def _engine(policy: str, num_live: int) -> EngineCore:
    config = EngineConfig(
        models=(MODEL,),
        device_bytes=DEVICE_BYTES,
        host_swap_bytes=400 * 10**9,  # the paper's 400 GB of Grace DRAM for KV
        block_tokens=BLOCK_TOKENS,
        scheduler=SchedulerConfig(policy=policy, max_running=num_live),
        rotation=RotationConfig(),
    )
    clock = _Clock()
    return EngineCore(config, _InstantExecutor(clock), _InstantTransfers(), clock)


def bench_policy(
    policy: str, num_live: int, *, steps: int = 60, warmup: int = 40, seed: int = 0
) -> BenchResult:
    """Median planning time per step with ``num_live`` requests kept alive.

    Lengths are ShareGPT-like (prompts 32-1024, outputs 64-1024 tokens); a request that
    finishes is replaced at once, so the live count stays fixed.
    """
    core = _engine(policy, num_live)
    times, stats = _keep_alive(core, lambda _: MODEL.name, num_live, steps, warmup, seed)
    h2d_blocks = sum(s.h2d_blocks for s in stats)
    return BenchResult(policy, num_live, statistics.median(times), steps, h2d_blocks / steps)


def _keep_alive(
    core: EngineCore,
    model_of: Callable[[int], str],
    num_live: int,
    steps: int,
    warmup: int,
    seed: int,
) -> tuple[list[float], list[StepStats]]:
    """Step with ``num_live`` ShareGPT-like requests alive (request i for model
    ``model_of(i)``; one that finishes is replaced at once); the planning times and
    stats of the ``steps`` steps after ``warmup``."""
    rng = random.Random(seed)
    counter = 0

    def arrive() -> None:
        nonlocal counter
        core.add_request(
            Request(
                id=f"b{counter}",
                model=model_of(counter),
                prompt_tokens=rng.randint(32, 1024),
                max_output_tokens=rng.randint(64, 1024),
                slo=SLO,
                t_arr=core.clock.now(),
            )
        )
        counter += 1

    for _ in range(num_live):
        arrive()
    times, kept = [], []
    for i in range(warmup + steps):
        stats = core.step()
        for _ in stats.finished:
            arrive()
        if i >= warmup:
            times.append(stats.schedule_s)
            kept.append(stats)
    return times, kept


def bench_scheduler(sizes: tuple[int, ...] = (256, 1024, 4096), steps: int = 60) -> list[str]:
    """LVF and FCFS at each size: median step planning time, the LVF/FCFS ratio, and the
    blocks LVF swapped in per step (what its planning moved)."""
    lines = [f"{'live':>6} {'lvf ms':>9} {'fcfs ms':>9} {'lvf/fcfs':>9} {'lvf h2d/step':>13}"]
    for n in sizes:
        lvf = bench_policy("lvf", n, steps=steps)
        fcfs = bench_policy("fcfs", n, steps=steps)
        ratio = lvf.median_s / fcfs.median_s
        lines.append(
            f"{n:>6} {lvf.median_s * 1e3:>9.3f} {fcfs.median_s * 1e3:>9.3f} {ratio:>9.2f} "
            f"{lvf.h2d_blocks_per_step:>13.0f}"
        )
    return lines


TENANTS = tuple(dataclasses.replace(CATALOG["mistral-7b"], name=f"m{i}") for i in range(8))


def bench_remap(num_live: int = 1024, *, steps: int = 60, warmup: int = 40) -> list[ReportItem]:
    """Median planning time per step with eight tenants and remapping on: the report's
    lines, then a figure per running cap (``remap.planning_ms.default_cap`` and
    ``.all_running``).

    Eight Mistral-7B-shaped models (116 GB of weights) on a 144 GB GH200's arena leave
    about 14 GB of KV for ``num_live`` ShareGPT-like requests spread over them, so KV
    runs short and the controller lends layers. Four tenants are spatial,
    four take turns; LVF orders every executing model's requests at once. Two running
    caps: the default (256), and every live request (HBM alone limits admission, so
    LVF rotates as much as B_xfer allows every step).
    """
    lines: list[ReportItem] = [
        f"{'models':>6} {'live':>6} {'running cap':>12} {'median ms':>10} "
        f"{'max layers lent':>16} {'layers restored':>16}"
    ]
    figures = []
    caps = {"default_cap": SchedulerConfig().max_running, "all_running": num_live}
    for cap_name, cap in caps.items():
        core = _tenant_engine(cap)
        times, stats = _keep_alive(
            core, lambda i: TENANTS[i % len(TENANTS)].name, num_live, steps, warmup, 0
        )
        lent = max(sum(s.remapped_layers.values()) for s in stats)
        restored = sum(s.layers_restored for s in stats)
        median_ms = statistics.median(times) * 1e3
        lines.append(
            f"{len(TENANTS):>6} {num_live:>6} {cap:>12} {median_ms:>10.3f} "
            f"{lent:>16} {restored:>16}"
        )
        figures.append(
            BenchFigure(f"remap.planning_ms.{cap_name}", median_ms, REMAP_TARGET_MS, "<=", "ms")
        )
    lines.append(f"(target <= {REMAP_TARGET_MS:g} ms)")
    return lines + figures


def _tenant_engine(max_running: int) -> EngineCore:
    tenants = tuple(
        TenantSpec(m.name, sharing="spatial" if i < 4 else "temporal")
        for i, m in enumerate(TENANTS)
    )
    config = EngineConfig(
        models=TENANTS,
        device_bytes=DEVICE_BYTES,
        host_swap_bytes=400 * 10**9,
        block_tokens=BLOCK_TOKENS,
        scheduler=SchedulerConfig(policy="lvf", max_running=max_running),
        rotation=RotationConfig(),
        tenants=tenants,
        remap=RemapConfig(enabled=True),
    )
    timings = SimConfig(models=TENANTS, hardware=gh200, slo=SLO).layer_timings(CopyCostModel(gh200))
    clock = _Clock()
    return EngineCore(config, _InstantExecutor(clock), _InstantTransfers(), clock, timings=timings)
