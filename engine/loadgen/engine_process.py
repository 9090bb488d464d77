"""An engine in its own process for benchmarks: start ``shunter engine`` on a free
loopback port with a model, stream completions at it, and time each token on arrival
(``Timings``); the quantiles and ratios the benchmarks print. Used by ``shunter bench
server``, ``bench isolation`` and the gateway's benchmarks, which measure an engine as
its clients see it."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import torch

PRESET = "tiny-llama"
MODEL = "m"


class Timings:
    """TTFT of each request and every gap between its consecutive tokens."""

    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.itl: list[float] = []

    def extend(self, other: Timings) -> None:
        self.ttft += other.ttft
        self.itl += other.itl

    def add(self, t_start: float, token_times: Sequence[float]) -> None:
        self.ttft.append(token_times[0] - t_start)
        self.itl += [b - a for a, b in itertools.pairwise(token_times)]

    def row(self, *widths: int) -> str:
        """TTFT p50, ITL p50 and ITL p90 in milliseconds, right-aligned in ``widths``."""
        figures = (
            quantile_ms(self.ttft, 0.5),
            quantile_ms(self.itl, 0.5),
            quantile_ms(self.itl, 0.9),
        )
        return " ".join(f"{v:>{w}}" for v, w in zip(figures, widths, strict=True))


def random_prompts(requests: int, prompt_tokens: int) -> list[list[int]]:
    """``requests`` prompts of ``prompt_tokens`` random token ids, the same every run."""
    gen = torch.Generator().manual_seed(0)
    prompts: list[list[int]] = torch.randint(
        4, 500, (requests, prompt_tokens), generator=gen
    ).tolist()
    return prompts


def free_port() -> int:
    """A loopback port nothing listens on (now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def wait_until_up(proc: subprocess.Popen[bytes], url: str, failure: Callable[[], str]) -> None:
    """Return once GET ``url`` answers. When ``proc`` exits first or two minutes pass,
    kill it and raise RuntimeError with ``failure()``."""
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(failure()) from None
            time.sleep(0.1)


def engine_command(port: int, kv_tokens: int, *args: str) -> list[str]:
    """The command line of ``shunter engine`` (this interpreter's) on CPU on loopback
    ``port`` with ``kv_tokens`` of KV a model, then ``args`` (``--model``, ...)."""
    shunter = Path(sys.executable).with_name("shunter")
    cpu = ["--device", "cpu", "--port", str(port), "--kv-tokens", str(kv_tokens)]
    return [str(shunter), "engine", *cpu, *args]


def start_engine(
    model_dir: Path, kv_tokens: int, threads: int, *, extra_args: Sequence[str] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    """``shunter engine`` serving ``model_dir`` as ``MODEL`` on CPU on a free loopback
    port (with ``extra_args``, e.g. more models), once its /health answers; the process
    and its base URL."""
    port = free_port()
    command = engine_command(port, kv_tokens, "--model", f"{MODEL}={model_dir}", *extra_args)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("SHUNTER_ENGINE_TOKEN", None)
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_until_up(proc, url + "/health", lambda: "shunter engine did not start")
    return proc, url


async def stream_completions(
    url: str,
    prompts: list[list[int]],
    max_tokens: int,
    concurrency: int,
    headers: Mapping[str, str] | None = None,
) -> Timings:
    """Stream every prompt to ``url``'s /v1/completions as ``MODEL`` (greedy, EOS
    ignored, ``max_tokens`` each), ``concurrency`` at a time, with ``headers`` on every
    request; each token is timed on arrival of the SSE chunk that carries its id. A
    status other than 200 raises RuntimeError."""
    timings = Timings()
    async with aiohttp.ClientSession(headers=dict(headers or {})) as session:

        async def one(prompt: list[int]) -> None:
            body = {
                "model": MODEL,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "return_token_ids": True,
            }
            t_start = time.perf_counter()
            timings.add(t_start, await stream_token_times(session, url, body))

        for first in range(0, len(prompts), concurrency):
            await asyncio.gather(*(one(p) for p in prompts[first : first + concurrency]))
    return timings


async def stream_token_times(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
) -> list[float]:
    """Stream ``body`` (``stream`` and ``return_token_ids`` on) to ``url``'s
    /v1/completions and return each token's arrival time (``time.perf_counter``), taken
    when the SSE chunk that carries its id arrives. A status other than 200 raises
    RuntimeError."""
    return (await stream_tokens(session, url, body, headers))[1]


async def stream_tokens(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
) -> tuple[list[int], list[float]]:
    """``stream_token_times``, with the token ids too."""
    body = {**body, "stream": True, "return_token_ids": True}
    ids: list[int] = []
    times: list[float] = []
    async with session.post(url + "/v1/completions", json=body, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"{url} ({body.get('model')}): {r.status} {await r.text()}")
        async for line in r.content:
            if line.startswith(b"data: {"):
                now = time.perf_counter()
                choice = json.loads(line[6:])["choices"][0]
                ids += choice["token_ids"]
                times += [now] * len(choice["token_ids"])
    return ids, times


def quantile_ms(values: list[float], q: float) -> str:
    """The ``q`` quantile of ``values`` (seconds) in milliseconds, or '-' when empty."""
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.2f}"


def median_ratio(server: list[float], ours: list[float]) -> float | None:
    """The ratio of the medians, ``server`` over ``ours``; None when either is empty."""
    if not server or not ours:
        return None
    return statistics.median(server) / statistics.median(ours)


def ratio(server: list[float], ours: list[float]) -> str:
    """``median_ratio`` as text ('1.04x'), or '-' when either is empty."""
    value = median_ratio(server, ours)
    return "-" if value is None else f"{value:.2f}x"
