"""``shunter bench server``: what the HTTP layer adds to TTFT and ITL.

The same requests (equal-length random prompts, greedy, ``max_tokens`` each, EOS
ignored) run twice on the same model and settings: in-process, added straight to a
TorchEngine and timed from the requests' own timestamps (as ``shunter generate`` runs
them), and through a ``shunter engine`` process on a loopback port, as streaming ``/v1/completions``
requests from aiohttp clients in this process, each token timed on arrival of the SSE
chunk that carries its id. The server runs in its own process, as it does in
production, so the clients do not share its interpreter. With one stream the requests
run one after another; with N, N at a time. Host wall time on this machine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import torch

from shunter.engine.exec.model_init import init_model_dir, preset_config
from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.serving import TorchEngine
from shunter.engine.server.models import ModelArg
from shunter.engine.server.serve import engine_config
from shunter.engine.server.settings import EngineSettings

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


def bench_server(
    *,
    model_dir: Path | None = None,
    streams: Sequence[int] = (1, 32),
    requests: int = 32,
    prompt_tokens: int = 64,
    max_tokens: int = 32,
    threads: int = 1,
    rounds: int = 3,
) -> Iterator[str]:
    """Run the comparison at each concurrency of ``streams`` (``rounds`` alternated
    rounds of both paths, samples pooled) and yield the report."""
    # One thread: tiny models gain nothing from more, and on a busy machine an
    # oversubscribed thread pool swamps the overhead being measured.
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="shunter-bench-") as tmp:
        if model_dir is None:
            model_dir = init_model_dir(Path(tmp) / PRESET, config=preset_config(PRESET), seed=0)
        settings = EngineSettings(models=(ModelArg(MODEL, model_dir),), kv_tokens=65536)
        prompts = random_prompts(requests, prompt_tokens)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        yield (
            f"{model_dir.name} on cpu, {torch.get_num_threads()} threads: {requests} requests "
            f"x {prompt_tokens} prompt tokens, {max_tokens} output tokens, greedy, "
            f"{rounds} alternated rounds"
        )
        engine = TorchEngine(
            {MODEL: model_dir}, engine_config(settings), device=torch.device("cpu")
        )
        server, url = start_engine(model_dir, settings.kv_tokens, torch.get_num_threads())
        try:
            _in_process(engine, prompts[:2], params, 2)  # warm-up
            asyncio.run(stream_completions(url, prompts[:2], max_tokens, 2))
            yield f"{'streams':>8} {'':14} {'TTFT p50 ms':>12} {'ITL p50 ms':>11} {'p90':>8}"
            for n in streams:
                # Alternated rounds, samples pooled: a busy machine slows both alike.
                ours, http = Timings(), Timings()
                for _ in range(rounds):
                    ours.extend(_in_process(engine, prompts, params, n))
                    http.extend(asyncio.run(stream_completions(url, prompts, max_tokens, n)))
                for label, t in (("in-process", ours), ("server", http)):
                    yield f"{n:>8} {label:14} {t.row(12, 11, 8)}"
                yield (
                    f"{n:>8} {'ratio':14} {ratio(http.ttft, ours.ttft):>12} "
                    f"{ratio(http.itl, ours.itl):>11}"
                )
        finally:
            server.terminate()
            server.wait(timeout=60)


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


def start_engine(
    model_dir: Path, kv_tokens: int, threads: int, *, extra_args: Sequence[str] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    """``shunter engine`` serving ``model_dir`` as ``MODEL`` on CPU on a free loopback
    port (with ``extra_args``, e.g. more models), once its /health answers; the process
    and its base URL."""
    port = free_port()
    shunter = Path(sys.executable).with_name("shunter")
    command = [
        str(shunter),
        "engine",
        "--device",
        "cpu",
        "--port",
        str(port),
        "--kv-tokens",
        str(kv_tokens),
        "--model",
        f"{MODEL}={model_dir}",
        *extra_args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("SHUNTER_ENGINE_TOKEN", None)
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_until_up(proc, url + "/health", lambda: "shunter engine did not start")
    return proc, url


def _in_process(
    engine: TorchEngine, prompts: list[list[int]], params: SamplingParams, concurrency: int
) -> Timings:
    timings = Timings()
    for first in range(0, len(prompts), concurrency):
        ids = [engine.add_request(MODEL, p, params) for p in prompts[first : first + concurrency]]
        requests = [engine.core.scheduler.requests[i] for i in ids]
        engine.run()
        for r in requests:
            timings.add(r.t_arr, r.token_times)
    return timings


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
    body = {**body, "stream": True, "return_token_ids": True}
    times: list[float] = []
    async with session.post(url + "/v1/completions", json=body, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"{url} ({body.get('model')}): {r.status} {await r.text()}")
        async for line in r.content:
            if line.startswith(b"data: {"):
                now = time.perf_counter()
                choice = json.loads(line[6:])["choices"][0]
                times += [now] * len(choice["token_ids"])
    return times


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
