"""A sweep: every policy at every request rate on one simulated engine, then the report."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shunter.engine.catalog import get_model
from shunter.engine.config import RotationConfig, SchedulerConfig, SloSpec
from shunter.engine.sim import report
from shunter.engine.sim.baselines import get_baseline
from shunter.engine.sim.hardware import get_profile
from shunter.engine.sim.metrics import summarize
from shunter.engine.sim.runner import SimConfig, simulate
from shunter.engine.workload.arrivals import (
    DEFAULT_ARRIVALS,
    Arrivals,
    gamma_arrivals,
    resolve_arrivals,
)
from shunter.engine.workload.generate import (
    build_workload,
    generated_config,
    generated_label,
    lengths_from,
)
from shunter.engine.workload.lengths import DEFAULT_WORKLOAD, LengthSampler, get_workload
from shunter.engine.workload.requests import WorkloadRequest
from shunter.engine.workload.traces import load_trace


class SloKnobs(Protocol):
    """A sweep's SLO targets and VLT weights, as the CLI gives them."""

    @property
    def ttft_slo_s(self) -> float: ...
    @property
    def tbt_slo_s(self) -> float: ...
    @property
    def alpha(self) -> float: ...
    @property
    def beta_b(self) -> float: ...
    @property
    def beta_f(self) -> float: ...


def sweep_slo(knobs: SloKnobs) -> SloSpec:
    """The one SLO class every simulated request of a sweep carries."""
    return SloSpec(
        "default",
        ttft_s=knobs.ttft_slo_s,
        tbt_s=knobs.tbt_slo_s,
        alpha=knobs.alpha,
        beta_b=knobs.beta_b,
        beta_f=knobs.beta_f,
    )


@dataclass(frozen=True)
class SweepSpec:
    """What ``shunter simulate`` was asked for (see its ``--help`` for each knob).

    Requests are generated with ``workload_name``'s lengths (``workload.WORKLOADS``; a
    ``sharegpt`` file replaces them) and ``arrivals``' gaps (``workload.get_arrivals``;
    ``cv`` other than 1 is the same as ``gamma:CV``). With a ``trace`` the workload is
    that JSONL trace, the same at every rate given.
    """

    model: str
    hardware: str
    policies: tuple[str, ...]
    rates: tuple[float, ...]
    duration_s: float
    ttft_slo_s: float
    tbt_slo_s: float
    alpha: float = 3.0
    beta_b: float = 0.0
    beta_f: float = 0.5
    xfer_budget: int | None = None
    swap_bandwidth_scale: float = 1.0
    max_running: int | None = None
    max_batch_tokens: int | None = None
    cv: float = 1.0
    arrivals: str = DEFAULT_ARRIVALS
    workload_name: str = DEFAULT_WORKLOAD
    sharegpt: str | None = None
    trace: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        get_workload(self.workload_name, self.sharegpt)
        resolve_arrivals(self.arrivals, self.cv)

    @property
    def arrival_process(self) -> Arrivals:
        return resolve_arrivals(self.arrivals, self.cv)

    def sim_config(self, policy: str) -> SimConfig:
        """The engine of ``policy``: a policy name with the engine's defaults, or a
        baseline's name (``baselines.BASELINES``) with that system's settings; limits the
        spec gives replace either's."""
        baseline = get_baseline(policy)
        if baseline is None:
            defaults = SchedulerConfig(policy=policy)
            scheduler = dataclasses.replace(
                defaults,
                max_running=self.max_running or defaults.max_running,
                max_batch_tokens=self.max_batch_tokens or defaults.max_batch_tokens,
                # None: what the link moves within a step, from the first step's on.
                xfer_budget_blocks=0 if self.xfer_budget is None else self.xfer_budget,
            )
            rotation = RotationConfig()
        else:
            scheduler = baseline.scheduler(
                max_running=self.max_running,
                max_batch_tokens=self.max_batch_tokens,
                xfer_budget_blocks=self.xfer_budget,
            )
            rotation = baseline.rotation()
        return SimConfig(
            models=(get_model(self.model),),
            hardware=get_profile(self.hardware),
            slo=sweep_slo(self),
            scheduler=scheduler,
            rotation=rotation,
            swap_bandwidth_scale=self.swap_bandwidth_scale,
            xfer_budget_from_link=baseline is None and self.xfer_budget is None,
        )

    def workload(self, rate: float, lengths: LengthSampler) -> list[WorkloadRequest]:
        """``round(rate * duration)`` requests; the same seed for every policy and rate,
        so policies at one rate see the very same requests."""
        if self.trace is not None:
            return load_trace(self.trace, (self.model,))
        rng = random.Random(self.seed)
        cv = self.arrival_process.cv
        arrivals = gamma_arrivals(rate, cv, round(rate * self.duration_s), rng)
        return build_workload(arrivals, lengths, self.model, rng)

    def lengths(self) -> LengthSampler:
        return lengths_from(self.sharegpt, self.workload_name)

    def describe(self) -> str:
        scale = self.swap_bandwidth_scale
        swap = "" if scale == 1.0 else f", swap bandwidth x{scale:g}"
        return (
            f"{self.model} on {self.hardware}, {self._arrivals()}, "
            f"SLO TTFT {self.ttft_slo_s:g} s / TBT {self.tbt_slo_s:g} s{swap}"
        )

    def _arrivals(self) -> str:
        if self.trace is not None:
            return f"trace {self.trace}"
        return generated_label(self.duration_s, self.workload_name, self.arrival_process)


def run_sweep(spec: SweepSpec, *, json_path: str | None, plot_path: str | None) -> int:
    """Simulate every (policy, rate), print the table, write JSON and plot if asked."""
    rows = sweep_rows(spec)
    print(report.format_table(rows, spec.describe()))
    if json_path:
        report.write_json(json_path, _config_json(spec), rows)
        print(f"{report.LABEL} results written to {json_path}")
    if plot_path:
        report.write_plot(plot_path, rows, spec.describe())
        print(f"{report.LABEL} plot written to {plot_path}")
    return 0


def sweep_rows(spec: SweepSpec) -> list[report.Row]:
    """Simulate every (policy, rate): one result row each, by policy in the spec's order,
    then by rate."""
    lengths = spec.lengths()
    rows: list[report.Row] = []
    configs = {policy: spec.sim_config(policy) for policy in spec.policies}
    for rate in spec.rates:
        workload = spec.workload(rate, lengths)
        for policy in spec.policies:
            run = simulate(configs[policy], workload)
            summary = summarize(
                run.records,
                ttft_slo_s=spec.ttft_slo_s,
                tbt_slo_s=spec.tbt_slo_s,
                # vLLM's benchmark duration: until the last request finished.
                duration_s=max(run.sim_duration_s, spec.duration_s),
            )
            rows.append(report.result_row(policy, rate, summary, run))
    rows.sort(key=lambda r: (spec.policies.index(r["policy"]), r["rps"]))
    return rows


def _config_json(spec: SweepSpec) -> dict[str, Any]:
    config = dataclasses.asdict(spec)
    # What each policy or baseline ran with (limits the spec left out are its own).
    config["engines"] = {}
    for policy in spec.policies:
        sim = spec.sim_config(policy)
        config["engines"][policy] = {
            **dataclasses.asdict(sim.scheduler),
            "eager_rotation": sim.rotation.eager,
        }
    hardware = get_profile(spec.hardware)
    config["hardware_profile"] = {
        **dataclasses.asdict(hardware),
        "copy_curve": [list(point) for point in hardware.copy_curve],
        "sources": list(hardware.sources),
    }
    config.update(
        generated_config(
            spec.workload_name, spec.arrival_process, sharegpt=spec.sharegpt, trace=spec.trace
        )
    )
    return config


def bench_simulator(*, rate: float, duration_s: float, policies: Sequence[str]) -> int:
    """Print simulated seconds per wall second for each policy and overall."""
    spec = SweepSpec(
        model="qwen2.5-32b",
        hardware="gh200",
        policies=tuple(policies),
        rates=(rate,),
        duration_s=duration_s,
        ttft_slo_s=5.0,
        tbt_slo_s=0.1,
    )
    workload = spec.workload(rate, spec.lengths())
    total_sim = total_wall = 0.0
    print(f"{report.LABEL}: simulator speed, {spec.describe()}, {rate:g} req/s")
    for policy in policies:
        start = time.perf_counter()
        run = simulate(spec.sim_config(policy), workload)
        wall = time.perf_counter() - start
        total_sim += run.sim_duration_s
        total_wall += wall
        print(
            f"  {policy:<5} {run.sim_duration_s:8.1f} simulated s in {wall:6.2f} wall s: "
            f"{run.sim_duration_s / wall:7.1f} sim-s/wall-s ({run.num_steps} steps)"
        )
    print(f"  all   {total_sim / total_wall:7.1f} sim-s/wall-s (target >= 20)")
    # One multi-model scenario too: two models sharing the KV pool, remapping and
    # rotation at once (c2 spatial, combined), at 4 req/s per model for 30 s.
    from shunter.engine.sim.scenario_sweep import ScenarioSpec

    scenario = ScenarioSpec("c2", ("spatial",), ("combined",), (4.0,), duration_s=30.0)
    workload = scenario.workload("spatial", 4.0)
    start = time.perf_counter()
    run = simulate(scenario.sim_config("combined", "spatial"), workload)
    wall = time.perf_counter() - start
    print(
        f"  scenario c2 spatial combined, 4 req/s per model for 30 s: "
        f"{run.sim_duration_s:.1f} simulated s in {wall:.2f} wall s: "
        f"{run.sim_duration_s / wall:.1f} sim-s/wall-s ({run.num_steps} steps; target >= 20)"
    )
    return 0
