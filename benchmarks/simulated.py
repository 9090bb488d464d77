"""Simulated runs: the simulator's policy sweep or one of the paper's scenarios, each
simulation scored like a measured rate (labelled SIMULATED)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from shunter.benchmarks.progress import Progress
from shunter.benchmarks.stopwatch import StopWatch
from shunter.benchmarks.targets import job_slo
from shunter.engine.loadgen.cli import SAMPLE_SHAREGPT
from shunter.engine.loadgen.client import RequestResult
from shunter.engine.loadgen.report import Slo, build_report
from shunter.engine.loadgen.runner import RateResult
from shunter.engine.workload.sources import LengthDist
from shunter.platform.models import BenchmarkJob


def simulate_job(job: BenchmarkJob, progress: Progress, watch: StopWatch) -> None:
    """The simulator's sweep (policies) or scenario (variants x sharing modes), each
    simulation scored like a measured rate; stops are honoured between simulations."""
    from shunter.engine.sim.runner import simulate
    from shunter.engine.sim.scenario_sweep import ScenarioSpec
    from shunter.engine.sim.sweep import SweepSpec
    from shunter.engine.workload.arrivals import gamma_arrivals
    from shunter.engine.workload.generate import build_workload
    from shunter.engine.workload.lengths import resample
    from shunter.engine.workload.sharegpt import sharegpt_lengths

    sim = job.simulator
    slo = job_slo(job)
    cv = 1.0 / math.sqrt(job.burstiness)

    def duration(rate: float) -> float:
        return job.duration_s if job.duration_s is not None else (job.num_requests or 1) / rate

    if "scenario" in sim:
        for rate in job.rates:
            scenario = ScenarioSpec(
                scenario=sim["scenario"],
                sharing=tuple(sim.get("sharing", ["temporal"])),
                variants=tuple(sim.get("variants", ["none", "oneiros", "rotasched", "combined"])),
                rates=(float(rate),),
                duration_s=duration(float(rate)),
                window_s=float(sim.get("window_s", 30.0)),
                hardware=sim.get("hardware"),
                ttft_slo_s=slo.ttft_s,
                tbt_slo_s=slo.tpot_s,
                cv=cv,
                seed=job.seed,
            )
            for sharing in scenario.sharing:
                requests = scenario.workload(sharing, float(rate))
                for variant in scenario.variants:
                    watch.check()
                    sim_run = simulate(scenario.sim_config(variant, sharing), requests)
                    report = _scored(requests, sim_run, float(rate), scenario.duration_s, slo, job)
                    progress.add(f"{variant} ({sharing})", report)
        return
    lengths: Callable[[random.Random], tuple[int, int]]
    if job.workload_kind == BenchmarkJob.WorkloadKind.SHAREGPT:
        lengths = resample(sharegpt_lengths(job.dataset_path or SAMPLE_SHAREGPT))
    else:
        inputs, outputs = LengthDist.parse(job.input_len), LengthDist.parse(job.output_len)

        def lengths(rng: random.Random) -> tuple[int, int]:
            return inputs.draw(rng), outputs.draw(rng)

    policies = sim.get("policies", ["lvf"])
    for rate in job.rates:
        spec = SweepSpec(
            model=sim["model"],
            hardware=sim.get("hardware", "gh200"),
            policies=tuple(policies),
            rates=(float(rate),),
            duration_s=duration(float(rate)),
            ttft_slo_s=slo.ttft_s,
            tbt_slo_s=slo.tpot_s,
            cv=cv,
            seed=job.seed,
        )
        rng = random.Random(job.seed)
        count = job.num_requests or round(float(rate) * spec.duration_s)
        arrivals = gamma_arrivals(float(rate), cv, max(1, count), rng)
        requests = build_workload(arrivals, lengths, spec.model, rng)
        for policy in policies:
            watch.check()
            sim_run = simulate(spec.sim_config(policy), requests)
            progress.add(policy, _scored(requests, sim_run, float(rate), spec.duration_s, slo, job))


def _scored(
    requests: Any, sim_run: Any, rate: float, duration_s: float, slo: Slo, job: BenchmarkJob
) -> RateResult:
    """A simulated run as the load generator's results: the same report and CSV rows."""
    results = []
    for i, (req, rec) in enumerate(zip(requests, sim_run.records, strict=True)):
        results.append(
            RequestResult(
                index=i,
                t_scheduled=req.t,
                input_tokens=req.prompt_tokens,
                expected_output_tokens=req.output_tokens,
                t_start=rec.t_arrival,
                t_end=rec.t_last_token if rec.t_last_token is not None else rec.t_arrival,
                token_times=list(rec.token_times),
                output_tokens=rec.num_output_tokens,
                success=rec.success,
                status=200 if rec.success else None,
                error_type=None if rec.success else "rejected",
            )
        )
    report = build_report(
        results,
        slo=slo,
        request_rate=rate,
        burstiness=job.burstiness,
        max_concurrency=None,
        duration_s=max(sim_run.sim_duration_s, duration_s),
    )
    return RateResult(report, results)
