"""``shunter bench isolation``: how much one tenant's heavy requests move another's TTFT.

One ``shunter engine`` process on this machine's CPU serves two tiny-llama models (2,048
token context): ``m`` for the quiet tenant and ``noisy`` for the other. The quiet tenant
streams short requests (a 4-token prompt, ``quiet_tokens`` output tokens, greedy, EOS
ignored) at a fixed rate, open loop, and each request's TTFT is taken on arrival of its
first token's SSE chunk. That schedule runs in three phases:

- ``alone``: nothing else runs (the baseline);
- ``long prompt``: the noisy tenant sends 2,047-token prompts back to back (the longest
  legal prompt, one output token each);
- ``max fan-out``: the noisy tenant sends, back to back, the largest fan-out the engine
  admits (``prompts`` x ``n`` sequences of 16 prompt tokens and 16 output tokens each).

Each phase prints the quiet tenant's TTFT P50/P99 and the P99 as a ratio of the
baseline's (the target is <= 1.5x), and how many noisy requests completed meanwhile with
their end-to-end P50 (what the step target costs the heavy tenant). Last, a 3,000 x 8
request is sent once and its HTTP status printed (the engine refuses it with 400). Host
wall time on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import tempfile
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import torch

from shunter.engine.benchfigure import BenchFigure, ReportItem
from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.engine.loadgen.engine_process import (
    MODEL,
    PRESET,
    quantile_ms,
    random_prompts,
    start_engine,
)

NOISY = "noisy"
LONG_PROMPT_TOKENS = 2047  # the tiny presets' context is 2,048 tokens
FANOUT_PROMPT_TOKENS = 16
TARGET_RATIO = 1.5


def bench_isolation(
    *,
    rate: float = 10.0,
    requests: int = 60,
    quiet_tokens: int = 8,
    fanout: tuple[int, int] = (16, 8),
    threads: int = 1,
    step_target_ms: float | None = None,
) -> Iterator[ReportItem]:
    """Run the three phases (``requests`` quiet requests at ``rate`` per second in each)
    and yield the report, then the figures ``isolation.quiet_p99_ratio.long_prompt`` and
    ``.max_fanout``; ``fanout`` is (prompts, n) of the noisy tenant's request;
    ``step_target_ms`` is the engine's (None: its default, from the SLO classes)."""
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="shunter-bench-") as tmp:
        quiet_dir = init_model_dir(Path(tmp) / "quiet", config=preset_config(PRESET), seed=0)
        noisy_dir = init_model_dir(Path(tmp) / "noisy", config=preset_config(PRESET), seed=1)
        prompts, n = fanout
        kv_tokens = prompts * n * 2 * (FANOUT_PROMPT_TOKENS + 16) + 2 * 2048
        extra = ["--model", f"{NOISY}={noisy_dir}"]
        if step_target_ms is not None:
            extra += ["--step-target-ms", str(step_target_ms)]
        server, url = start_engine(quiet_dir, kv_tokens, threads, extra_args=extra)
        target = "default" if step_target_ms is None else f"{step_target_ms:g} ms"
        yield (
            f"{PRESET} x2 on cpu, {threads} thread(s), step target {target}: quiet tenant "
            f"{requests} requests at {rate:g}/s (4 prompt tokens, {quiet_tokens} output "
            "tokens) per phase"
        )
        try:
            yield from asyncio.run(_phases(url, rate, requests, quiet_tokens, prompts, n))
        finally:
            server.terminate()
            server.wait(timeout=60)


async def _phases(
    url: str, rate: float, requests: int, quiet_tokens: int, prompts: int, n: int
) -> list[ReportItem]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        quiet = _QuietTenant(session, url, quiet_tokens)
        await quiet.run(rate, 4)  # warm-up
        long_body = completion_body(NOISY, random_prompts(1, LONG_PROMPT_TOKENS)[0], max_tokens=1)
        fan_body = completion_body(
            NOISY, random_prompts(prompts, FANOUT_PROMPT_TOKENS), max_tokens=16
        )
        fan_body["n"] = n
        lines: list[ReportItem] = [
            f"{'phase':<32} {'TTFT p50 ms':>12} {'p99 ms':>9} {'p99 ratio':>10}"
            f"   noisy requests: {'done':>4} {'e2e p50 ms':>11}"
        ]
        alone: list[float] = []
        figures = []
        phases: list[tuple[str, str, dict[str, Any] | None]] = [
            ("alone", "alone", None),
            (f"long prompt ({LONG_PROMPT_TOKENS} tokens)", "long_prompt", long_body),
            (f"max fan-out ({prompts} x n={n})", "max_fanout", fan_body),
        ]
        for label, key, noise in phases:
            noisy: list[float] = []
            if noise is None:
                ttfts = await quiet.run(rate, requests)
                alone = ttfts
            else:
                ttfts = await _beside(quiet.run(rate, requests), session, url, noise, noisy)
            ratio = _quantile(ttfts, 0.99) / _quantile(alone, 0.99)
            verdict = ""
            if noise is not None:
                figure = BenchFigure(
                    f"isolation.quiet_p99_ratio.{key}", ratio, TARGET_RATIO, "<=", "x"
                )
                figures.append(figure)
                verdict = "ok" if figure.meets(figure.target) else "MISSED"
            lines.append(
                f"{label:<32} {quantile_ms(ttfts, 0.5):>12} {quantile_ms(ttfts, 0.99):>9} "
                f"{ratio:>9.2f}x {verdict:<6} {len(noisy):>10} {quantile_ms(noisy, 0.5):>11}"
            )
        huge = completion_body(NOISY, [[5, 6, 7, 8]] * 3000, max_tokens=16)
        huge["n"] = 8
        async with session.post(url + "/v1/completions", json=huge) as r:
            body = await r.json(content_type=None)
            message = body.get("error", {}).get("message", "") if isinstance(body, dict) else ""
        lines.append(f"3000 x n=8 request: HTTP {r.status} {message}")
        lines.append(f"target: the quiet tenant's P99 TTFT within {TARGET_RATIO}x of alone")
        return lines + figures


class _QuietTenant:
    """Streams short requests at a fixed rate and keeps each one's TTFT (seconds)."""

    def __init__(self, session: aiohttp.ClientSession, url: str, max_tokens: int) -> None:
        self.session, self.url, self.max_tokens = session, url, max_tokens

    async def run(self, rate: float, requests: int) -> list[float]:
        t0 = time.perf_counter()
        tasks = []
        for i in range(requests):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(self._one(i)))
        return list(await asyncio.gather(*tasks))

    async def _one(self, i: int) -> float:
        body = completion_body(MODEL, [4 + i % 400, 5, 6, 7], max_tokens=self.max_tokens)
        body["stream"] = True
        t_start = time.perf_counter()
        async with self.session.post(self.url + "/v1/completions", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"quiet request: {r.status} {await r.text()}")
            ttft = None
            async for line in r.content:
                if ttft is None and line.startswith(b"data: {"):
                    ttft = time.perf_counter() - t_start
        if ttft is None:
            raise RuntimeError("quiet request: no token arrived")
        return ttft


async def _beside(
    quiet: Awaitable[list[float]],
    session: aiohttp.ClientSession,
    url: str,
    noise: dict[str, Any],
    noisy_e2e: list[float],
) -> list[float]:
    """Run ``quiet`` while ``noise`` is sent again and again, one at a time, each time
    with a cache salt of its own (prefix caching would otherwise serve every repeat of
    the prompt from the first); the end-to-end seconds of each noisy request that
    completed go to ``noisy_e2e``."""

    async def noisy() -> None:
        for i in itertools.count():
            body = {**noise, "cache_salt": f"noise-{i}"}
            t_start = time.perf_counter()
            async with session.post(url + "/v1/completions", json=body) as r:
                if r.status != 200:
                    raise RuntimeError(f"noisy request: {r.status} {await r.text()}")
                await r.read()
            noisy_e2e.append(time.perf_counter() - t_start)

    noise_task = asyncio.create_task(noisy())
    await asyncio.sleep(0.2)  # the first noisy request is in the engine
    try:
        ttfts = await quiet
    finally:
        noise_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await noise_task  # a refused noisy request raises here
    return ttfts


def completion_body(model: str, prompt: Any, *, max_tokens: int) -> dict[str, Any]:
    """A greedy ``/v1/completions`` body for ``model`` that ignores EOS."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
