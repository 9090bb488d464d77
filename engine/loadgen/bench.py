"""``shunter bench loadgen``: is the load generator itself a bottleneck?

The SSE fixture (``sse_fixture``) runs in its own process and streams fixed tokens, one
per step of its ticker; the generator drives it open loop with Poisson arrivals. The
figures: the rate requests actually went out at against the schedule's own rate, the
completion rate, and the generator's timing error, headers sent minus scheduled time, as
percentiles.

The baseline, measured in the same run and the same window: the generator's dispatcher
in a process of its own on the same kind of event loop, firing on the same schedule at
the same times and sending nothing. Its lateness is what the machine's scheduler (and
the other processes on it) cost any timer then; the generator's error above it is its
own. Host wall time on this machine, shared with the fixture (which runs at a lower
priority, standing in for a server elsewhere).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import time
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection

from shunter.engine.benchfigure import BenchFigure, ReportItem
from shunter.engine.loadgen.client import Target
from shunter.engine.loadgen.report import Slo, build_report
from shunter.engine.loadgen.runner import Dispatcher, run_async, run_schedule
from shunter.engine.loadgen.sse_fixture import fixture_process
from shunter.engine.sim.metrics import percentile
from shunter.engine.workload.sources import LengthDist, SyntheticWorkload

PROMPT_TOKENS = 32
FIXTURE_NICE = 10
# Time for the baseline's process to start (a fresh interpreter) before the schedule does.
BASELINE_START_S = 2.0
TIMING_ERROR_P99_TARGET_MS = 5.0


async def timer_lateness(times: Sequence[float], start_at: float) -> list[float]:
    """Seconds the generator's dispatcher, spawning nothing, fires after each of
    ``times`` counted from ``start_at`` (perf_counter): the lateness no request avoids."""
    loop = asyncio.get_running_loop()
    deadlines = [start_at + t for t in times]
    late = [0.0] * len(times)

    def record(i: int) -> None:
        late[i] = time.perf_counter() - deadlines[i]

    await Dispatcher(loop, deadlines, record).run()
    return late


def _baseline_process(times: Sequence[float], start_at: float, out: Connection) -> None:
    """The baseline's own process: ``timer_lateness`` sent back through ``out``."""
    out.send(run_async(timer_lateness(times, start_at)))
    out.close()


def _quantiles(values_s: Sequence[float]) -> str:
    def q(p: float) -> str:
        value = percentile(values_s, p)
        return "-" if value is None else f"{value * 1000:.3f}"

    return f"p50 {q(50)}  p90 {q(90)}  p99 {q(99)}  max {q(100)}"


def bench_loadgen(
    *,
    rate: float = 200.0,
    duration_s: float = 20.0,
    tokens: int = 64,
    itl_ms: float = 10.0,
    seed: int = 0,
) -> Iterator[ReportItem]:
    """Run the benchmark and yield its report lines, then the figures ``loadgen.sent_rps``
    (at least ``rate``) and ``loadgen.timing_error_p99_ms`` (when any request was sent)."""
    num_requests = max(2, round(rate * duration_s))
    workload = SyntheticWorkload(
        LengthDist("constant", PROMPT_TOKENS, PROMPT_TOKENS), LengthDist("constant", tokens, tokens)
    )
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    yield (
        f"SSE fixture in its own process (nice {FIXTURE_NICE}): {tokens} tokens per response, "
        f"one per {itl_ms:g} ms step; {num_requests} requests, Poisson at {rate:g} req/s, "
        f"open loop ({os.cpu_count()} CPUs, load average {load})"
    )
    # Poisson arrivals conditioned on exactly num_requests in the run (the order
    # statistics of uniform times), so the schedule's own rate is the nominal one.
    rng = random.Random(seed)
    times = sorted(rng.uniform(0.0, duration_s) for _ in range(num_requests))
    schedule = list(zip(times, workload.draw(num_requests, rng), strict=True))
    # The fixture stands in for a server on another machine: at a lower priority it does
    # not take CPU from the generator it measures when the cores are shared.
    with fixture_process(tokens=tokens, itl_ms=itl_ms, nice=FIXTURE_NICE) as url:
        # The baseline runs in its own process over the same window, so it sees the
        # machine as the generator does; it only sleeps, so it takes next to no CPU.
        context = multiprocessing.get_context("spawn")
        receive, send = context.Pipe(duplex=False)
        start_at = time.perf_counter() + BASELINE_START_S
        baseline = context.Process(target=_baseline_process, args=(times, start_at, send))
        baseline.start()
        send.close()
        requests = run_async(run_schedule(Target(url, "fixture"), schedule, start_at=start_at))
        floor: list[float] = receive.recv()
        baseline.join()
    report = build_report(
        requests, slo=Slo(), request_rate=rate, burstiness=1.0, max_concurrency=None
    )
    ends = [t for r in requests if r.success and (t := r.t_end) is not None]
    schedule_rate = (len(times) - 1) / (times[-1] - times[0])
    sent_rate = report.achieved_request_rate or 0.0
    done_rate = (len(ends) - 1) / (max(ends) - min(ends)) if len(ends) > 1 else 0.0
    lags = [lag for r in requests if (lag := r.send_lag) is not None]
    yield (
        f"sent {sent_rate:.1f} req/s (schedule's own rate {schedule_rate:.1f}, ratio "
        f"{sent_rate / schedule_rate:.3f}); completed {report.completed}/{num_requests} "
        f"at {done_rate:.1f} req/s, failed {report.failed} {report.error_counts or ''}".rstrip()
    )
    yield (
        f"timing error (sent - scheduled) ms: {_quantiles(lags)}  "
        f"(target p99 <= {TIMING_ERROR_P99_TARGET_MS:g})"
    )
    yield f"baseline: the dispatcher alone, same schedule and window, ms: {_quantiles(floor)}"
    itl = "-" if report.median_itl_ms is None else f"{report.median_itl_ms:.2f}"
    itl99 = "-" if report.p99_itl_ms is None else f"{report.p99_itl_ms:.2f}"
    yield f"ITL seen by the client ms: median {itl}  p99 {itl99}  (fixture step {itl_ms:g})"
    yield BenchFigure("loadgen.sent_rps", sent_rate, rate, ">=", "req/s")
    if (lag_p99 := percentile(lags, 99)) is not None:
        yield BenchFigure(
            "loadgen.timing_error_p99_ms", lag_p99 * 1000, TIMING_ERROR_P99_TARGET_MS, "<=", "ms"
        )
