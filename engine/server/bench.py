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
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from shunter.engine.benchmarks.models import model_or_preset
from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.serving import TorchEngine
from shunter.engine.loadgen.engine_process import (
    MODEL,
    PRESET,
    Timings,
    random_prompts,
    ratio,
    start_engine,
    stream_completions,
)
from shunter.engine.server.models import ModelArg
from shunter.engine.server.serve import engine_config
from shunter.engine.server.settings import EngineSettings


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
        model_dir = yield from model_or_preset(tmp, model_dir, PRESET)
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
