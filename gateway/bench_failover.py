"""``shunter bench gateway --replicas N``: a steady load through the gateway while one of
a model's replicas is killed, against the same load with none killed.

N ``shunter engine`` processes (tiny-llama, CPU) serve the same model as N nodes, and one
``shunter web`` process routes a tenant's requests over them, on the platform
``bench.bench_gateway`` uses (PostgreSQL and Redis, or ``embedded``). No beat or worker
runs: no poll marks the killed node down, so what is measured is the gateway's own
failover (a refused connection retried on another replica, the dead one cooled).

Two phases of ``duration_s`` each, with ``clients`` closed-loop clients streaming
``/v1/completions`` one request after another: first with every replica up, then with
the first engine killed (SIGKILL) ``kill_at`` of the way through. A request counts as

- served: a 200 stream that ended with ``[DONE]`` and no error event;
- failed: anything else before its first token (an error status, a refused or broken
  connection, an error event first): the client saw a new request fail;
- broken: a stream cut after its first token reached the client (the engine died under
  it; it ends with an error event, which no retry can undo).

The report gives each phase's counts and TTFT percentiles, the P99 TTFT ratio of the
killed phase to the other (no target: half the phase runs on fewer replicas), and the
figure ``gateway.failover_new_served``, the share of new requests served with one
killed (target: all of them).
Host wall time on this machine; the processes share its cores.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from shunter.engine.benchfigure import BenchFigure, ReportItem
from shunter.engine.loadgen.engine_process import MODEL, random_prompts, start_engine
from shunter.gateway.bench import (
    ENGINE_KV_TOKENS,
    Platform,
    bench_platform,
    forget_quotas,
    register_model,
    start_gateway,
)

# New requests that must be served while a replica dies: all of them.
SERVED_SHARE_TARGET = 1.0
# The longest a client waits for one request (its stream included).
REQUEST_TIMEOUT_S = 120.0


@dataclass
class Outcomes:
    """What the requests of one phase did; TTFTs in seconds, of served ones."""

    served: int = 0
    failed: int = 0
    broken: int = 0
    ttft: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.served + self.failed + self.broken

    def fail(self, why: str) -> None:
        self.failed += 1
        self.errors[why] = self.errors.get(why, 0) + 1

    def p(self, q: float) -> float:
        """The ``q`` quantile of the TTFTs, in milliseconds (nan when none)."""
        if not self.ttft:
            return float("nan")
        ordered = sorted(self.ttft)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_gateway_failover(
    *,
    model_dir: Path | None = None,
    replicas: int = 2,
    clients: int = 8,
    duration_s: float = 20.0,
    kill_at: float = 0.5,
    prompt_tokens: int = 64,
    max_tokens: int = 32,
    threads: int = 1,
    embedded: bool = False,
) -> Iterator[ReportItem]:
    """Run both phases and yield the report (``bench.BenchError``: PostgreSQL or Redis
    cannot be used)."""
    if replicas < 2:
        raise ValueError("a replica can only be killed with at least 2 (--replicas 2)")
    with bench_platform(model_dir, embedded=embedded) as (on, model):
        yield from _phases(
            on, model, replicas, clients, duration_s, kill_at, prompt_tokens, max_tokens, threads
        )


def _phases(
    platform: Platform,
    model_dir: Path,
    replicas: int,
    clients: int,
    duration_s: float,
    kill_at: float,
    prompt_tokens: int,
    max_tokens: int,
    threads: int,
) -> Iterator[ReportItem]:
    engines = [start_engine(model_dir, ENGINE_KV_TOKENS, threads) for _ in range(replicas)]
    gateway, tenant = None, None
    try:
        secret, tenant = register_model(platform.env, [url for _, url in engines], model_dir)
        log = Path(platform.env["SHUNTER_VAR_DIR"]) / "gateway.log"
        gateway, gateway_url = start_gateway(platform.env, log)
        with urllib.request.urlopen(gateway_url + "/healthz", timeout=10) as r:
            health = json.load(r)
        yield (
            f"gateway on the {platform.description}; its /healthz: database "
            f"{health.get('database')}, redis {health.get('redis', 'not used')}"
        )
        yield (
            f"{model_dir.name} on cpu on {replicas} engines (nodes) with {threads} thread(s) "
            f"each; {clients} closed-loop clients streaming {prompt_tokens} prompt tokens, "
            f"{max_tokens} output tokens, greedy; two phases of {duration_s:g} s; no poll "
            f"runs (the gateway's own failover)"
        )
        prompts = random_prompts(64, prompt_tokens)
        auth = {"Authorization": f"Bearer {secret}"}
        warm = _load(gateway_url, auth, prompts, max_tokens, clients, 2.0, None)
        asyncio.run(warm)
        phases = {
            "none killed": asyncio.run(
                _load(gateway_url, auth, prompts, max_tokens, clients, duration_s, None)
            ),
            "one killed": asyncio.run(
                _load(
                    gateway_url,
                    auth,
                    prompts,
                    max_tokens,
                    clients,
                    duration_s,
                    (kill_at * duration_s, engines[0][0]),
                )
            ),
        }
        yield (
            f"{'phase':12} {'requests':>8} {'served':>7} {'failed':>7} {'broken':>7} "
            f"{'TTFT p50 ms':>12} {'TTFT p99 ms':>12}"
        )
        for name, o in phases.items():
            yield (
                f"{name:12} {o.total:>8} {o.served:>7} {o.failed:>7} {o.broken:>7} "
                f"{o.p(0.5):>12.1f} {o.p(0.99):>12.1f}"
            )
        none, killed = phases["none killed"], phases["one killed"]
        for why, n in sorted(killed.errors.items()):
            yield f"failed with one killed: {n} x {why}"
        p99_ratio = killed.p(0.99) / none.p(0.99) if none.ttft else float("nan")
        new = killed.served + killed.failed  # requests that had not reached a token
        share = killed.served / new if new else float("nan")
        yield (
            f"one of {replicas} replicas killed at {kill_at * duration_s:g} s: P99 TTFT "
            f"{p99_ratio:.2f}x the run with none killed; new requests failed "
            f"{killed.failed} of {new} (target 0); streams cut after their first token "
            f"{killed.broken}"
        )
        yield BenchFigure("gateway.failover_new_served", share, SERVED_SHARE_TARGET, ">=", "share")
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(timeout=30)
        for proc, _ in engines:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
        if tenant is not None and platform.env.get("REDIS_URL"):
            forget_quotas(platform.env["REDIS_URL"], tenant)


async def _load(
    url: str,
    headers: dict[str, str],
    prompts: list[list[int]],
    max_tokens: int,
    clients: int,
    duration_s: float,
    kill: tuple[float, subprocess.Popen[bytes]] | None,
) -> Outcomes:
    """``clients`` clients sending one request after another for ``duration_s``; with
    ``kill`` (after seconds, process), that process gets SIGKILL then."""
    outcomes = Outcomes()
    end = time.monotonic() + duration_s
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:

        async def client(index: int) -> None:
            n = index
            while time.monotonic() < end:
                body = {
                    "model": MODEL,
                    "prompt": prompts[n % len(prompts)],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stream": True,
                }
                await _one(session, url, body, outcomes)
                n += clients

        async def killer(after_s: float, proc: subprocess.Popen[bytes]) -> None:
            await asyncio.sleep(after_s)
            proc.send_signal(signal.SIGKILL)

        tasks = [client(i) for i in range(clients)]
        if kill is not None:
            tasks.append(killer(*kill))
        await asyncio.gather(*tasks)
    return outcomes


async def _one(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], outcomes: Outcomes
) -> None:
    """One streamed request, counted in ``outcomes``."""
    t0 = time.perf_counter()
    first: float | None = None
    try:
        async with session.post(url + "/v1/completions", json=body) as r:
            if r.status != 200:
                outcomes.fail(f"HTTP {r.status}")
                return
            async for line in r.content:
                if line.startswith(b"data: [DONE]"):
                    if first is None:
                        outcomes.fail("no token")
                    else:
                        outcomes.served += 1
                        outcomes.ttft.append(first - t0)
                    return
                if not line.startswith(b"data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    if first is None:
                        outcomes.fail(f"error event: {event['error'].get('code')}")
                    else:
                        outcomes.broken += 1
                    return
                if first is None and event.get("choices"):
                    first = time.perf_counter()
    except (aiohttp.ClientError, TimeoutError) as e:
        if first is None:
            outcomes.fail(type(e).__name__)
        else:
            outcomes.broken += 1
        return
    # The stream ended without [DONE].
    if first is None:
        outcomes.fail("no [DONE]")
    else:
        outcomes.broken += 1
