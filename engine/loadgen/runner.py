"""Run a workload against a target at a request rate, open loop.

``run_rate`` is the library entry point (the CLI calls it once per rate, and so can
benchmark jobs): it draws the schedule (arrival times from the arrival process, or a
trace's own times), sends each request at its time whatever the server does (open loop:
a slow server does not slow the arrivals), optionally caps the requests in flight, and
returns every request's result with the rate's report. All randomness comes from
``seed``.
"""

from __future__ import annotations

import asyncio
import gc
import math
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ParamSpec, TypeVar

import aiohttp

from shunter.engine.loadgen.arrivals import ArrivalProcess
from shunter.engine.loadgen.client import RequestResult, Target, send_request, trace_config
from shunter.engine.loadgen.report import RateReport, Slo, build_report, csv_rows
from shunter.engine.workload.requests import RequestSpec
from shunter.engine.workload.sources import TraceWorkload, Workload

# The schedule starts this long after the session is up, so setting up does not count
# as timing error on the first requests.
START_DELAY_S = 0.05
CONNECT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RateResult:
    """One rate's run: its report and every request's result, in schedule order."""

    report: RateReport
    requests: list[RequestResult] = field(repr=False)

    def to_dict(self, *, with_requests: bool = False) -> dict[str, Any]:
        """JSON-ready: the report's fields, with ``requests`` (each a dict) if asked."""
        out = self.report.to_dict()
        if with_requests:
            out["requests"] = [asdict(r) for r in self.requests]
        return out

    def csv_rows(self) -> list[dict[str, Any]]:
        return list(csv_rows(self.report.request_rate, self.requests))


def build_schedule(
    workload: Workload,
    rate: float | None,
    rng: random.Random,
    *,
    arrival: ArrivalProcess,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> list[tuple[float, RequestSpec]]:
    """``(send time, request)`` pairs in time order.

    A trace keeps its own times, scaled to ``rate`` when one is given (as recorded
    otherwise); without ``num_requests`` or ``duration_s`` it plays once, with them it
    is cut or cycled. Any other workload needs ``rate`` and exactly one of the two, and
    takes its times from ``arrival``.
    """
    if num_requests is not None and duration_s is not None:
        raise ValueError("give num_requests or duration_s, not both")
    if isinstance(workload, TraceWorkload):
        factor = _trace_factor(workload, rate)
        if num_requests is not None:
            specs = workload.draw(num_requests, rng)
        elif duration_s is not None:
            specs = _trace_until(workload, rng, duration_s, factor)
        else:
            specs = list(workload.specs)
        times = [(s.t or 0.0) * factor for s in specs]
        return list(zip(times, specs, strict=True))
    if rate is None:
        raise ValueError(f"the {workload.name} workload needs a request rate")
    times = arrival.times(rate, rng, num_requests=num_requests, duration_s=duration_s)
    return list(zip(times, workload.draw(len(times), rng), strict=True))


def _trace_factor(workload: TraceWorkload, rate: float | None) -> float:
    """The multiplier on a trace's times that makes its mean rate ``rate``, keeping its
    shape (1: as recorded; 0: all at once)."""
    if rate is None:
        return 1.0
    if math.isinf(rate):
        return 0.0
    natural = workload.mean_rate()
    return natural / rate if math.isfinite(natural) else 1.0


def _trace_until(
    workload: TraceWorkload, rng: random.Random, duration_s: float, factor: float
) -> list[RequestSpec]:
    n = len(workload.specs)
    count = n
    while True:
        specs = workload.draw(count, rng)
        if factor == 0.0 or (specs[-1].t or 0.0) * factor >= duration_s:
            return [s for s in specs if (s.t or 0.0) * factor < duration_s]
        count *= 2


async def run_schedule(
    target: Target,
    schedule: Sequence[tuple[float, RequestSpec]],
    *,
    max_concurrency: int | None = None,
    request_timeout_s: float = 600.0,
    start_at: float | None = None,
) -> list[RequestResult]:
    """Send each request of ``schedule`` at its time and return the results, in order.

    ``max_concurrency`` caps requests in flight (a request past its time waits for a
    slot; its send lag then includes the wait). ``request_timeout_s`` bounds the wait
    for any byte of a response. Times count from ``start_at`` (a ``time.perf_counter()``
    value, the same clock in every process on Linux), by default from just after the
    session is up.
    """
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError("max_concurrency must be at least 1")
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    results = [
        RequestResult(i, t, spec.input_len, spec.output_len) for i, (t, spec) in enumerate(schedule)
    ]
    # What exists before the run (modules, the schedule) leaves the collector's view, so
    # that no full collection over it pauses the sends; it returns when the run ends.
    gc.collect()
    gc.freeze()
    try:
        return await _send_all(target, schedule, results, slots, request_timeout_s, start_at)
    finally:
        gc.unfreeze()


async def _send_all(
    target: Target,
    schedule: Sequence[tuple[float, RequestSpec]],
    results: list[RequestResult],
    slots: asyncio.Semaphore | None,
    request_timeout_s: float,
    start_at: float | None,
) -> list[RequestResult]:
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=request_timeout_s
    )
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, trace_configs=[trace_config()]
    ) as session:

        async def one(result: RequestResult, spec: RequestSpec) -> None:
            if slots is None:
                await send_request(session, target, spec, result, t0)
            else:
                async with slots:
                    await send_request(session, target, spec, result, t0)

        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []

        def spawn(i: int) -> None:
            tasks.append(loop.create_task(one(results[i], schedule[i][1])))

        t0 = time.perf_counter() + START_DELAY_S if start_at is None else start_at
        await Dispatcher(loop, [t0 + t for t, _ in schedule], spawn).run()
        await asyncio.gather(*tasks)
    return results


class Dispatcher:
    """Calls ``spawn(i)`` at ``deadlines[i]`` (perf_counter times, ascending) from a timer
    callback, so a request's task is created in the loop iteration its timer fires in,
    not one later as after a coroutine's sleep. Deadlines already past are spawned at
    once, in order (the schedule catches up, it never drops requests)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        deadlines: Sequence[float],
        spawn: Callable[[int], None],
    ) -> None:
        self._loop = loop
        self._deadlines = deadlines
        self._spawn = spawn
        self._next = 0
        self._done: asyncio.Future[None] = loop.create_future()
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None

    async def run(self) -> None:
        """Return once every index is spawned."""
        self._fire()
        try:
            await self._done
        finally:
            if self._timer is not None:
                self._timer.cancel()

    def _fire(self) -> None:
        now = time.perf_counter()
        deadlines = self._deadlines
        while self._next < len(deadlines) and deadlines[self._next] <= now:
            self._spawn(self._next)
            self._next += 1
        if self._next == len(deadlines):
            if not self._done.done():
                self._done.set_result(None)
            return
        # uvloop rounds timers to whole milliseconds and may fire early: _fire then
        # spawns nothing and sets a timer for the rest.
        self._timer = self._loop.call_later(deadlines[self._next] - now, self._fire)


async def run_rate_async(
    target: Target,
    workload: Workload,
    rate: float | None,
    *,
    arrival: ArrivalProcess | None = None,
    num_requests: int | None = None,
    duration_s: float | None = None,
    max_concurrency: int | None = None,
    seed: int = 0,
    slo: Slo | None = None,
    request_timeout_s: float = 600.0,
) -> RateResult:
    """Run ``workload`` against ``target`` at ``rate`` requests/s (see
    ``build_schedule``) and score it against ``slo``."""
    arrival = arrival or ArrivalProcess()
    schedule = build_schedule(
        workload,
        rate,
        random.Random(seed),
        arrival=arrival,
        num_requests=num_requests,
        duration_s=duration_s,
    )
    results = await run_schedule(
        target, schedule, max_concurrency=max_concurrency, request_timeout_s=request_timeout_s
    )
    trace = isinstance(workload, TraceWorkload)
    if rate is None:
        times = [t for t, _ in schedule]
        rate = (len(times) - 1) / times[-1] if len(times) > 1 and times[-1] > 0 else math.inf
    report = build_report(
        results,
        slo=slo or Slo(),
        request_rate=rate,
        burstiness=None if trace else arrival.burstiness,
        max_concurrency=max_concurrency,
    )
    return RateResult(report, results)


_T = TypeVar("_T")
_P = ParamSpec("_P")


def run_async(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` on a fresh event loop: uvloop's when installed (it reads streams with
    less overhead per chunk), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def on_own_loop(fn: Callable[_P, Coroutine[Any, Any, _T]]) -> Callable[_P, _T]:
    """``fn`` as a plain function that runs its coroutine to completion with
    ``run_async``, for callers without an event loop (the CLI, a worker process)."""

    def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        return run_async(fn(*args, **kwargs))

    return run


run_rate = on_own_loop(run_rate_async)
"""``run_rate_async`` on its own event loop, with the same arguments."""
