"""``shunter bench prefix``: what automatic prefix caching saves, on a CPU engine.

Two workloads, each sent to two ``shunter engine`` processes serving the same model
(random weights, a context of ``context`` tokens), one with prefix caching and one
without (``--no-enable-prefix-caching``), as streaming ``/v1/completions`` requests:

- **document QA**: ``documents`` documents of ``doc_tokens`` random token ids, each asked
  ``questions`` questions of ``question_tokens`` tokens (the document, then the
  question), in a shuffled order, ``concurrency`` at a time. Every question after a
  document's first can reuse the document's KV.
- **multi-turn chat**: ``conversations`` conversations of ``turns`` turns, all opening
  with one system prompt of ``system_tokens`` tokens; each turn's prompt is the
  conversation so far (earlier prompts and answers) and a new user message of
  ``question_tokens`` tokens. The conversations' turn t go together, after every turn
  t - 1 answered.

A third engine, with the cache and device KV for one context only (two documents),
runs the document QA again: the documents evicted from its device are served from the
host copies eager rotation made (the prefix cache's host tier). Then, in-process, one
question's TTFT when its document's prefix is found only in host memory, against the
same question recomputing it and finding it on the device.

Per workload and engine: TTFT p50 and p90, the prompt tokens the engine computed
(prompt tokens less prefix cache hits) and the hits found in host memory, from its
``/metrics``. Host wall time on this machine; the ratios are TTFT p50 over the engine
without the cache.
"""

from __future__ import annotations

import asyncio
import math
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import median

import aiohttp
import torch
from prometheus_client.parser import text_string_to_metric_families

from shunter.engine.benchfigure import BenchFigure, ReportItem
from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.serving import TorchEngine, model_specs
from shunter.engine.exec.sizing import (
    BLOCK_TOKENS,
    KVNeed,
    page_bytes_for,
    serving_config,
    weight_bytes,
)
from shunter.engine.loadgen.engine_process import (
    MODEL,
    PRESET,
    Timings,
    median_ratio,
    quantile_ms,
    ratio,
    start_engine,
    stream_tokens,
)
from shunter.engine.memory.arena import Arena
from shunter.engine.memory.pool import BlockPool

# Doc-QA TTFT p50 with the cache over without: issue target "<= 0.3x".
DOCQA_TTFT_TARGET = 0.3
# A host-tier hit's TTFT over recomputing the prefix: the issue asks for "faster".
HOST_HIT_TARGET = 1.0


def bench_prefix(
    *,
    model_dir: Path | None = None,
    documents: int = 4,
    questions: int = 4,
    doc_tokens: int = 4096,
    question_tokens: int = 32,
    conversations: int = 4,
    turns: int = 4,
    system_tokens: int = 1024,
    max_tokens: int = 16,
    concurrency: int = 2,
    threads: int = 1,
    rounds: int = 3,
) -> Iterator[ReportItem]:
    """Run both workloads on both engines and yield the report and the doc-QA figure."""
    context = 2 * doc_tokens
    with tempfile.TemporaryDirectory(prefix="shunter-bench-") as tmp:
        if model_dir is None:
            config = preset_config(PRESET) | {"max_position_embeddings": context}
            model_dir = init_model_dir(Path(tmp) / PRESET, config=config, seed=0)
        rng = random.Random(0)
        docs = [_tokens(rng, doc_tokens) for _ in range(documents)]
        qa = [d + _tokens(rng, question_tokens) for d in docs for _ in range(questions)]
        rng.shuffle(qa)
        yield (f"{model_dir.name} on cpu, {threads} thread(s), greedy, {max_tokens} output tokens")
        yield (
            f"document QA: {documents} documents x {questions} questions, {doc_tokens} + "
            f"{question_tokens} prompt tokens, {concurrency} at a time; multi-turn chat: "
            f"{conversations} conversations x {turns} turns of {question_tokens} tokens "
            f"after a {system_tokens}-token system prompt"
        )
        yield (
            f"{'workload':10} {'cache':6} {'TTFT p50 ms':>12} {'p90':>9} "
            f"{'prefill tokens':>15} {'host hits':>10}"
        )
        kv = max(4 * context, (documents + conversations) * context)
        setups = (
            ("on", ("--enable-prefix-caching",), ("doc QA", "chat")),
            ("off", ("--no-enable-prefix-caching",), ("doc QA", "chat")),
            # Device KV for one context (two documents): the others' cached blocks are
            # evicted from it, and their host copies (made by eager rotation) serve.
            ("host", ("--hbm-budget", str(_one_context_budget(model_dir, context))), ("doc QA",)),
        )
        results: dict[tuple[str, str], Timings] = {}
        for label, args, workloads in setups:
            server, url = start_engine(model_dir, kv, threads, extra_args=(*args, "--open-metrics"))
            try:
                asyncio.run(_send_all(url, [list(range(4, 68))], 2, 1))  # warm-up
                for name in workloads:
                    before = asyncio.run(_counters(url))
                    if name == "chat":
                        chat = _chat(
                            url, conversations, turns, system_tokens, question_tokens, max_tokens
                        )
                        timings = asyncio.run(chat)
                    else:
                        timings = asyncio.run(_send_all(url, qa, max_tokens, concurrency))
                    after = asyncio.run(_counters(url))
                    computed, host = (int(a - b) for a, b in zip(after, before, strict=True))
                    results[name, label] = timings
                    yield (
                        f"{name:10} {label:6} "
                        f"{quantile_ms(timings.ttft, 0.5):>12} {quantile_ms(timings.ttft, 0.9):>9} "
                        f"{computed:>15} {host:>10}"
                    )
            finally:
                server.terminate()
                server.wait(timeout=60)
        for name, label in (("doc QA", "on"), ("chat", "on"), ("doc QA", "host")):
            on, off = results[name, label], results[name, "off"]
            yield f"{name:10} {label:6} {ratio(on.ttft, off.ttft):>12}  TTFT p50 over off"
        on, off = results["doc QA", "on"], results["doc QA", "off"]
        value = median_ratio(on.ttft, off.ttft) or math.nan
        yield BenchFigure("prefix.docqa_ttft_p50_ratio", value, DOCQA_TTFT_TARGET, "<=", "x")
        yield from _host_tier(model_dir, docs[:2], question_tokens, max_tokens, threads, rounds)
        yield from _bookkeeping()


def _host_tier(
    model_dir: Path,
    docs: list[list[int]],
    question_tokens: int,
    max_tokens: int,
    threads: int,
    rounds: int,
) -> Iterator[ReportItem]:
    """In-process, with device KV for one document and every full block copied to host
    ahead (eager rotation, watermark 0): a question on document A after document B took
    the device finds A's prefix in host memory only. Its TTFT against the same request
    recomputing the prefix (no cache) and finding it on the device (asked again at once),
    each the median of ``rounds`` rounds."""
    torch.set_num_threads(threads)
    rng = random.Random(2)
    a, b = docs
    tokens = len(a) + question_tokens + max_tokens
    specs = model_specs({MODEL: model_dir})
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ttft: dict[str, list[float]] = {"recompute": [], "host": [], "device": []}
    for _ in range(rounds):
        for cached in (False, True):
            budget = _one_context_budget(model_dir, tokens)
            config = serving_config(
                specs,
                [KVNeed("one document", MODEL, tokens)],
                hbm_budget=budget,
                host_swap_bytes=4 * budget,  # room for both documents' host copies
                force_rotation=True,
                prefix_caching=cached,
            )
            engine = TorchEngine({MODEL: model_dir}, config, device=torch.device("cpu"))
            for doc in (a, b):
                _first_token_s(engine, doc + _tokens(rng, question_tokens), params)
            asked = a + _tokens(rng, question_tokens)
            first = _first_token_s(engine, asked, params)
            if cached:
                assert engine.core.memory.prefix_stats.host_hits[MODEL] > 0
                ttft["host"].append(first)
                ttft["device"].append(_first_token_s(engine, asked, params))
            else:
                ttft["recompute"].append(first)
    yield (
        f"host tier (in-process, device KV for one document, every full block copied to "
        f"host): TTFT of a question on a {len(a)}-token document, median of {rounds}"
    )
    for label, values in ttft.items():
        yield f"  prefix {label:10} {1000 * median(values):>9.2f} ms"
    value = median(ttft["host"]) / median(ttft["recompute"])
    yield f"  host over recompute {value:.3f}x"
    yield BenchFigure("prefix.host_hit_ttft_ratio", value, HOST_HIT_TARGET, "<=", "x")


def _bookkeeping(free_blocks: int = 40_000, hits: int = 256, rounds: int = 20) -> Iterator[str]:
    """Host time of the pool's side of a hit: looking up and taking back ``hits`` cached
    blocks of a pool with ``free_blocks`` free (a GPU's pool of 2 MiB blocks is of that
    order), median of ``rounds``."""
    pool = BlockPool(Arena(free_blocks, 1024), MODEL, 1024)
    blocks = pool.allocate(free_blocks)
    hashes = [i.to_bytes(16, "little") for i in range(hits * rounds)]
    for b, h in zip(blocks, hashes, strict=False):
        pool.publish(b, h)
    pool.free(blocks)
    times = []
    for r in range(rounds):
        t0 = time.perf_counter()
        pool.share(pool.lookup(hashes[r * hits : (r + 1) * hits]))
        times.append(time.perf_counter() - t0)
    yield (
        f"pool bookkeeping: looking up and taking back {hits} cached blocks beside "
        f"{free_blocks} free ones: {1000 * median(times):.3f} ms (median of {rounds})"
    )


def _first_token_s(engine: TorchEngine, prompt: list[int], params: SamplingParams) -> float:
    """Seconds from the request's arrival to its first token (the engine's clock)."""
    rid = engine.add_request(MODEL, prompt, params)
    request = engine.core.scheduler.requests[rid]
    engine.run()
    return request.token_times[0] - request.t_arr


def _one_context_budget(model_dir: Path, context: int) -> int:
    """Arena bytes for the model's weights and KV for one context of ``context`` tokens."""
    specs = model_specs({MODEL: model_dir})
    page = page_bytes_for(specs, BLOCK_TOKENS)
    blocks = -(-context // BLOCK_TOKENS)
    return weight_bytes(specs, page) + blocks * specs[0].block_bytes(BLOCK_TOKENS)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(4, 500) for _ in range(n)]


def _body(prompt: list[int], max_tokens: int) -> dict[str, object]:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


async def _send_all(
    url: str, prompts: list[list[int]], max_tokens: int, concurrency: int
) -> Timings:
    timings = Timings()
    async with aiohttp.ClientSession() as session:

        async def one(prompt: list[int]) -> None:
            t_start = time.perf_counter()
            _, times = await stream_tokens(session, url, _body(prompt, max_tokens))
            timings.add(t_start, times)

        for first in range(0, len(prompts), concurrency):
            await asyncio.gather(*(one(p) for p in prompts[first : first + concurrency]))
    return timings


async def _chat(
    url: str, conversations: int, turns: int, system: int, message: int, max_tokens: int
) -> Timings:
    """Every conversation's turn t together; a turn's prompt is all before it and a new
    message (the same messages every run)."""
    rng = random.Random(1)
    timings = Timings()
    opening = _tokens(rng, system)
    history = [list(opening) for _ in range(conversations)]
    async with aiohttp.ClientSession() as session:

        async def turn(c: int) -> None:
            prompt = history[c] + _tokens(rng, message)
            t_start = time.perf_counter()
            ids, times = await stream_tokens(session, url, _body(prompt, max_tokens))
            timings.add(t_start, times)
            history[c] = prompt + ids

        for _ in range(turns):
            await asyncio.gather(*(turn(c) for c in range(conversations)))
    return timings


async def _counters(url: str) -> tuple[float, float]:
    """The engine's counts so far: prompt tokens it computed (prompt tokens less prefix
    cache hits) and prefix cache hits found in host memory."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as r:
        text = await r.text()
    names = (
        "vllm:prompt_tokens_total",
        "vllm:prefix_cache_hits_total",
        "shunter:prefix_cache_host_hits_total",
    )
    totals = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    prompt, hits, host = (totals[n] for n in names)
    return prompt - hits, host
