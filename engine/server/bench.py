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
from collections.abc import Iterator, Sequence
from pathlib import Path

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
        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(4, 500, (requests, prompt_tokens), generator=gen).tolist()
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        yield (
            f"{model_dir.name} on cpu, {torch.get_num_threads()} threads: {requests} requests "
            f"x {prompt_tokens} prompt tokens, {max_tokens} output tokens, greedy, "
            f"{rounds} alternated rounds"
        )
        engine = TorchEngine(
            {MODEL: model_dir}, engine_config(settings), device=torch.device("cpu")
        )
        server, url = _start_server(model_dir, settings.kv_tokens, torch.get_num_threads())
        try:
            _in_process(engine, prompts[:2], params, 2)  # warm-up
            asyncio.run(_through_server(url, prompts[:2], max_tokens, 2))
            yield f"{'streams':>8} {'':14} {'TTFT p50 ms':>12} {'ITL p50 ms':>11} {'p90':>8}"
            for n in streams:
                # Alternated rounds, samples pooled: a busy machine slows both alike.
                ours, http = Timings(), Timings()
                for _ in range(rounds):
                    ours.extend(_in_process(engine, prompts, params, n))
                    http.extend(asyncio.run(_through_server(url, prompts, max_tokens, n)))
                for label, t in (("in-process", ours), ("server", http)):
                    ttft, itl, itl90 = _ms(t.ttft, 0.5), _ms(t.itl, 0.5), _ms(t.itl, 0.9)
                    yield f"{n:>8} {label:14} {ttft:>12} {itl:>11} {itl90:>8}"
                yield (
                    f"{n:>8} {'ratio':14} {_ratio(http.ttft, ours.ttft):>12} "
                    f"{_ratio(http.itl, ours.itl):>11}"
                )
        finally:
            server.terminate()
            server.wait(timeout=60)


def _start_server(
    model_dir: Path, kv_tokens: int, threads: int
) -> tuple[subprocess.Popen[bytes], str]:
    """``shunter engine`` on a free loopback port, once its /health answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
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
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("SHUNTER_ENGINE_TOKEN", None)
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("shunter engine did not start") from None
            time.sleep(0.1)


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


async def _through_server(
    url: str, prompts: list[list[int]], max_tokens: int, concurrency: int
) -> Timings:
    timings = Timings()
    async with aiohttp.ClientSession() as session:

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
            times: list[float] = []
            async with session.post(url + "/v1/completions", json=body) as r:
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        now = time.perf_counter()
                        choice = json.loads(line[6:])["choices"][0]
                        times += [now] * len(choice["token_ids"])
            timings.add(t_start, times)

        for first in range(0, len(prompts), concurrency):
            await asyncio.gather(*(one(p) for p in prompts[first : first + concurrency]))
    return timings


def _ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.2f}"


def _ratio(server: list[float], ours: list[float]) -> str:
    if not server or not ours:
        return "-"
    return f"{statistics.median(server) / statistics.median(ours):.2f}x"
