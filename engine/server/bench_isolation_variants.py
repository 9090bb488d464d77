"""``shunter bench isolation --on engine``: a victim tenant's latency alone and beside an
aggressor on a real ``shunter engine``, for each compared variant (host wall time).

The same comparison as the simulator's (``engine.sim.isolation``), on this machine's
CPU: one engine process serves two tiny-llama models, ``m`` for the victim (requests of
the interactive SLO class, ``X-Shunter-Slo``) and ``aggressor`` (the batch class). Each
variant is an engine started with its policy and remapping (``ENGINE_VARIANTS``; every
variant swaps a preempted request's KV to host, the engine's only preemption) and the
engine's step target for the interactive class (half its TBT, ``serve.step_target_s``'s
rule). In it the victim streams ``requests`` short requests with Poisson arrivals at
``rate``, alone, then the same schedule beside the aggressor's long prompts, Poisson at
ten times the rate over the victim's window, open loop. Every token is timed on arrival
of its SSE chunk; TBT is the gap between a request's consecutive tokens, and records are
scored by the simulator's metrics (``sim.metrics.summarize``). Each row (``format_row``)
gives the victim's P99 TTFT and TBT alone and beside, their ratios, its joint attainment,
and the aggressor's served rate and attainment; then the preemptions each engine made.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import torch

from shunter.engine.api.headers import SLO_HEADER, TENANT_HEADER, slo_to_header
from shunter.engine.benchfigure import ReportItem
from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.engine.config import SloSpec, default_step_target_s
from shunter.engine.loadgen.engine_process import (
    MODEL,
    PRESET,
    random_prompts,
    start_engine,
    stream_token_times,
)
from shunter.engine.server.bench_isolation import completion_body
from shunter.engine.sim.isolation import (
    AGGRESSOR_RATE_FACTOR,
    BATCH,
    DEFAULT_VARIANTS,
    HEADER,
    INTERACTIVE,
    Comparison,
    describe_slo,
    figures,
    format_row,
    served_summary,
    targets_line,
)
from shunter.engine.sim.metrics import RequestRecord
from shunter.engine.workload.arrivals import poisson_arrivals

AGGRESSOR = "aggressor"
# Variant -> (the engine's policy, remapping): vLLM is FCFS without remapping, Oneiros
# FCFS with it; the others as ``sim.isolation.VARIANTS`` names them.
ENGINE_VARIANTS: dict[str, tuple[str, bool]] = {
    "vllm": ("fcfs", False),
    "lvf": ("lvf", False),
    "lvf+": ("lvf+", False),
    "oneiros": ("fcfs", True),
    "combined": ("lvf", True),
    "combined+": ("lvf+", True),
    "lvf+shed": ("lvf+shed", False),
    "combined+shed": ("lvf+shed", True),
}
VICTIM_PROMPT_TOKENS = 32
VICTIM_OUTPUT_TOKENS = 16
# Long prompts, 16 times the victim's. Not the simulator's 1,469: on one thread of a
# 2-core host a 1,469-token prompt of the 2-layer tiny-llama took 0.34 s of the engine
# in-process, a 512-token one 56 ms (25 ms step target), and through the server, sent
# faster than it could serve them, 512-token prompts were served at 9.5 a second. The
# default victim rate, 0.5 req/s, has the aggressor send 5 a second: about half of that.
AGGRESSOR_PROMPT_TOKENS = 512
# Azure's coding trace's median output, as in the simulator.
AGGRESSOR_OUTPUT_TOKENS = 13
WARMUP_REQUESTS = 4
# KV tokens a model: four of its 2,048-token contexts, more than the default load holds at
# once (no engine preempted a request in the measured run).
KV_TOKENS = 8192

Timed = tuple[float, dict[str, Any]]
"""A request body and when to send it (seconds from the start of a phase)."""


def bench_isolation_variants(
    *,
    variants: tuple[str, ...] = DEFAULT_VARIANTS,
    rate: float = 0.5,
    requests: int = 20,
    layers: int = 2,
    threads: int = 1,
    seed: int = 0,
    step_target_ms: float | None = None,
) -> Iterator[ReportItem]:
    """For each of ``variants``, start an engine, run the victim's ``requests`` at
    ``rate`` per second alone and beside the aggressor, and yield the row; then the
    figures ``isolation.engine.{variant}.ttft_p99_ratio`` and ``.attainment``, and a
    line of each engine's preemptions. Both models have ``layers`` decoder layers (the
    tiny preset's 2 leave none to lend: a model keeps two resident). ``step_target_ms``
    is the engine's step target (None: half the interactive class's TBT)."""
    unknown = [v for v in variants if v not in ENGINE_VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}: choose from {list(ENGINE_VARIANTS)}")
    torch.set_num_threads(threads)
    if step_target_ms is None:
        step_target_ms = 1000 * default_step_target_s([INTERACTIVE, BATCH])
    victim_times = poisson_arrivals(rate, requests, random.Random(seed))
    # Twice the draws the victim's window holds on average, cut at its last arrival.
    aggressor_times = [
        t
        for t in poisson_arrivals(
            AGGRESSOR_RATE_FACTOR * rate,
            AGGRESSOR_RATE_FACTOR * requests * 2,
            random.Random(seed + 1),
        )
        if t <= victim_times[-1]
    ]
    config = preset_config(PRESET)
    config["num_hidden_layers"] = layers
    victim, aggressor = describe_slo(INTERACTIVE), describe_slo(BATCH)
    yield (
        f"{PRESET} x2 ({layers} layers) on cpu, {threads} thread(s), step target "
        f"{step_target_ms:g} ms: victim {requests} requests, Poisson at {rate:g}/s ({victim}; "
        f"{VICTIM_PROMPT_TOKENS} prompt, {VICTIM_OUTPUT_TOKENS} output tokens); aggressor "
        f"{len(aggressor_times)} requests over the same window, Poisson at "
        f"{AGGRESSOR_RATE_FACTOR * rate:g}/s ({aggressor}; {AGGRESSOR_PROMPT_TOKENS} prompt, "
        f"{AGGRESSOR_OUTPUT_TOKENS} output tokens); seed {seed}; host wall time"
    )
    yield HEADER
    preemptions = []
    with tempfile.TemporaryDirectory(prefix="shunter-bench-") as tmp:
        victim_dir = init_model_dir(Path(tmp) / "victim", config=config, seed=0)
        aggressor_dir = init_model_dir(Path(tmp) / AGGRESSOR, config=config, seed=1)
        for variant in variants:
            policy, remap = ENGINE_VARIANTS[variant]
            settings = Path(tmp) / f"{variant}.toml"
            settings.write_text(f'policy = "{policy}"\n')
            extra = [
                "--model",
                f"{AGGRESSOR}={aggressor_dir}",
                "--config",
                str(settings),
                "--step-target-ms",
                f"{step_target_ms:g}",
                "--remap" if remap else "--no-remap",
            ]
            server, url = start_engine(victim_dir, KV_TOKENS, threads, extra_args=extra)
            try:
                c, state = asyncio.run(_compare(url, variant, rate, victim_times, aggressor_times))
            finally:
                server.terminate()
                server.wait(timeout=60)
            yield format_row(c)
            yield from figures("isolation.engine", c)
            transfers = state["transfers"]
            preemptions.append(
                f"{variant} {transfers['preemptions']} ({transfers['rotations']} swapped back)"
            )
    yield "preemptions over both phases: " + ", ".join(preemptions)
    yield targets_line()


async def _compare(
    url: str, variant: str, rate: float, victim_times: list[float], aggressor_times: list[float]
) -> tuple[Comparison, dict[str, Any]]:
    """The victim's schedule alone, then beside the aggressor's; the comparison and the
    engine's ``/admin/state`` at the end."""
    victim = [
        (t, completion_body(MODEL, p, max_tokens=VICTIM_OUTPUT_TOKENS))
        for t, p in zip(
            victim_times, random_prompts(len(victim_times), VICTIM_PROMPT_TOKENS), strict=True
        )
    ]
    long_prompts = random_prompts(len(aggressor_times), AGGRESSOR_PROMPT_TOKENS)
    aggressor = [
        (t, completion_body(AGGRESSOR, p, max_tokens=AGGRESSOR_OUTPUT_TOKENS))
        for t, p in zip(aggressor_times, long_prompts, strict=True)
    ]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        client = _Client(session, url)
        await client.phase([(0.0, body) for _, body in victim[:WARMUP_REQUESTS]], [])
        alone, _, t_alone = await client.phase(victim, [])
        beside, pushed, t_beside = await client.phase(victim, aggressor)
        async with session.get(url + "/admin/state") as r:
            state: dict[str, Any] = await r.json()
    comparison = Comparison(
        variant,
        alone=served_summary(alone, INTERACTIVE, t_start=t_alone),
        beside=served_summary(beside, INTERACTIVE, t_start=t_beside),
        aggressor=served_summary(pushed, BATCH, t_start=t_beside),
        offered=AGGRESSOR_RATE_FACTOR * rate,
    )
    return comparison, state


class _Client:
    """Sends requests open loop and times each token on arrival of its SSE chunk."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url

    async def phase(
        self, victim: list[Timed], aggressor: list[Timed]
    ) -> tuple[list[RequestRecord], list[RequestRecord], float]:
        """Send each request of ``victim`` and ``aggressor`` at its time (seconds from
        now); the records of each, and the start (``time.perf_counter``)."""
        t0 = time.perf_counter()
        victims = [asyncio.create_task(self._at(t0 + t, b, INTERACTIVE)) for t, b in victim]
        pushes = [asyncio.create_task(self._at(t0 + t, b, BATCH)) for t, b in aggressor]
        return list(await asyncio.gather(*victims)), list(await asyncio.gather(*pushes)), t0

    async def _at(self, t: float, body: dict[str, Any], slo: SloSpec) -> RequestRecord:
        await asyncio.sleep(max(0.0, t - time.perf_counter()))
        headers = {SLO_HEADER: slo_to_header(slo), TENANT_HEADER: slo.name}
        t_arrival = time.perf_counter()
        times = await stream_token_times(self.session, self.url, body, headers)
        return RequestRecord.from_token_times(t_arrival, times)
