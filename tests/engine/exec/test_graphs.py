"""Decode steps on static buffers (CUDA graphs): padding, buffers and fallbacks give the
eager pass's logits, KV and tokens; the capture itself runs wherever CUDA does."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from shunter.engine.config import RemapConfig
from shunter.engine.exec.batch import ForwardBatch, SequenceChunk
from shunter.engine.exec.forced_remap import ForcedRemap
from shunter.engine.exec.graphs import (
    MAX_GRAPH_BATCH,
    MAX_LAYOUTS,
    StaticDecode,
    capture_or_eager,
    graph_batch_sizes,
)
from shunter.engine.exec.loader import load_model
from shunter.engine.exec.model import Transformer
from shunter.engine.exec.serving import TorchEngine
from tests.engine.exec.conftest import CPU, NUM_LAYERS, new_cache, transformer
from tests.engine.exec.test_remap_exec import GREEDY, assert_frames_agree, config_for, run, work

BLOCK_TOKENS = 4
MAX_CONTEXT = 64  # 16 blocks a table: small enough for the reference's full-width read


def test_buckets_follow_vllms_capture_sizes() -> None:
    assert graph_batch_sizes(1) == (1,)
    assert graph_batch_sizes(5) == (1, 2, 4, 8)
    assert graph_batch_sizes(32) == (1, 2, 4, 8, 16, 24, 32)
    assert graph_batch_sizes(1024)[-1] == MAX_GRAPH_BATCH
    with pytest.raises(ValueError, match="max_batch"):
        graph_batch_sizes(0)


def prefilled(
    model: Transformer, num_seqs: int, *, spare_blocks: int = 4
) -> tuple[torch.Tensor, list[SequenceChunk]]:
    """A cache holding ``num_seqs`` prompts (5 to 40 tokens, blocks interleaved from the
    back, some blocks spare at the end) and each one's next decode step."""
    gen = torch.Generator().manual_seed(num_seqs)
    lengths = [int(torch.randint(5, 41, (1,), generator=gen)) for _ in range(num_seqs)]
    need = [-(-(n + 1) // BLOCK_TOKENS) for n in lengths]
    total = sum(need) + spare_blocks
    order = list(reversed(range(total - spare_blocks)))
    tables = []
    for n in need:
        tables.append(order[:n])
        order = order[n:]
    cache = new_cache(model, total, BLOCK_TOKENS)
    prompts = [torch.randint(4, 500, (n,), generator=gen).tolist() for n in lengths]
    prefill = [SequenceChunk(p, 0, t, samples=True) for p, t in zip(prompts, tables, strict=True)]
    batch = ForwardBatch.build(
        prefill,
        block_tokens=BLOCK_TOKENS,
        device=model.device,
        sliding_window=model.arch.sliding_window,
    )
    first = model.forward(batch, cache).argmax(-1).tolist()
    decodes = [
        SequenceChunk([tok], len(p), t, samples=True)
        for tok, p, t in zip(first, prompts, tables, strict=True)
    ]
    return cache, decodes


def eager_logits(
    model: Transformer, cache: torch.Tensor, chunks: list[SequenceChunk]
) -> torch.Tensor:
    batch = ForwardBatch.build(
        chunks,
        block_tokens=BLOCK_TOKENS,
        device=model.device,
        sliding_window=model.arch.sliding_window,
    )
    return model.forward(batch, cache)


@pytest.mark.parametrize("num_seqs", [1, 3, 8])
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2", "tiny-mistral"])
def test_a_static_step_gives_the_eager_logits_and_its_padding_writes_nothing(
    preset: str, num_seqs: int, tiny_dirs: dict[str, Path]
) -> None:
    """Mistral's window (24) is shorter than the longer contexts here."""
    model = transformer(tiny_dirs[preset])
    cache, chunks = prefilled(model, num_seqs)
    eager_cache = cache.clone()
    expected = eager_logits(model, eager_cache, chunks)
    static = StaticDecode(model, cache, BLOCK_TOKENS, max_batch=8, max_context=MAX_CONTEXT)
    # Stale ids in the table buffers, as a previous step leaves them.
    static.tables.fill_(cache.shape[0] - 1)
    logits = static.run(chunks)
    assert logits.shape == expected.shape
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert logits.argmax(-1).tolist() == expected.argmax(-1).tolist()
    # The real rows wrote their KV where the eager pass did (past the first layer it
    # differs in the last bits: attention summed over a wider, masked context), and
    # padding rows wrote nothing, not even into the spare blocks at the end.
    torch.testing.assert_close(cache, eager_cache, rtol=1e-5, atol=1e-5)
    assert not cache[-4:].any()
    assert static.num_passes == 1 and static.num_replays == 0


def test_a_second_step_reuses_the_buffers_with_new_tables(tiny_dirs: dict[str, Path]) -> None:
    """Buffers keep the last step's rows; a smaller batch after a larger one, with its
    blocks moved elsewhere (as a rotation moves them), reads only what it is given."""
    model = transformer(tiny_dirs["tiny-llama"])
    cache, chunks = prefilled(model, 6, spare_blocks=12)
    static = StaticDecode(model, cache, BLOCK_TOKENS, max_batch=8, max_context=MAX_CONTEXT)
    eager_cache = cache.clone()
    torch.testing.assert_close(static.run(chunks), eager_logits(model, eager_cache, chunks))
    # The first request's step again, its blocks copied to the spare ones at the end.
    first = chunks[0]
    spare = list(range(cache.shape[0] - len(first.block_table), cache.shape[0]))
    for src, dst in zip(first.block_table, spare, strict=True):
        cache[dst] = cache[src]
        eager_cache[dst] = eager_cache[src]
    moved = [SequenceChunk([7], first.start, spare, samples=True)]
    torch.testing.assert_close(static.run(moved), eager_logits(model, eager_cache, moved))
    torch.testing.assert_close(cache, eager_cache, rtol=1e-5, atol=1e-5)


def test_steps_a_static_pass_cannot_run_fall_back(tiny_dirs: dict[str, Path]) -> None:
    model = transformer(tiny_dirs["tiny-llama"])
    cache, chunks = prefilled(model, 3)
    static = StaticDecode(model, cache, BLOCK_TOKENS, max_batch=2, max_context=MAX_CONTEXT)
    assert static.max_batch == 2
    assert static.fits(chunks[:2], streams=False)
    assert not static.fits(chunks, streams=False)  # past the largest bucket
    assert not static.fits(chunks[:2], streams=True)  # a layer streams through a slot
    assert not static.fits([], streams=False)
    prefill = dataclasses.replace(chunks[0], token_ids=[5, 6])
    assert not static.fits([prefill], streams=False)
    quiet = dataclasses.replace(chunks[0], samples=False)
    assert not static.fits([quiet], streams=False)
    table = list(range(MAX_CONTEXT // BLOCK_TOKENS + 1))
    assert static.fits([SequenceChunk([5], MAX_CONTEXT - 1, table, samples=True)], streams=False)
    assert not static.fits([SequenceChunk([5], MAX_CONTEXT, table, samples=True)], streams=False)


def test_a_capture_that_fails_leaves_the_model_eager(
    tiny_dirs: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    model = transformer(tiny_dirs["tiny-llama"])
    static = StaticDecode(model, new_cache(model, 4, BLOCK_TOKENS), BLOCK_TOKENS, max_batch=4)
    with caplog.at_level("WARNING"):
        assert capture_or_eager(static, "m") is None  # no CUDA here
    assert "m: CUDA graphs not captured, decode runs eager: CUDA graphs need a CUDA" in caplog.text


def test_a_mixture_of_experts_has_no_static_pass(tiny_dirs: dict[str, Path]) -> None:
    model = transformer(tiny_dirs["tiny-mixtral"])
    with pytest.raises(ValueError, match="routes experts on the host"):
        StaticDecode(model, new_cache(model, 4, BLOCK_TOKENS), BLOCK_TOKENS, max_batch=4)


def install_static(engine: TorchEngine, max_batch: int = 8) -> list[StaticDecode]:
    """Give every model of a CPU engine the static pass a CUDA engine captures."""
    installed = []
    for served in engine.executor.models.values():
        served.static = StaticDecode(
            served.model,
            served.kv_cache,
            served.block_tokens,
            max_batch=max_batch,
            frames=served.frames,
            max_context=MAX_CONTEXT,
        )
        installed.append(served.static)
    return installed


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sequential", "async"])
def test_static_steps_keep_every_token_while_layers_are_lent_and_come_back(
    async_scheduling: bool, deep_dirs: dict[str, Path]
) -> None:
    """Forced rotation and lent counts up and down: steps whose layers are all home run
    the static pass, the others eager, and the tokens are those of a plain engine."""
    requests = [(m, p, 30) for m, p, _ in work(6, seed=5)]
    expected = run(TorchEngine(deep_dirs, config_for(deep_dirs, requests), device=CPU), requests)
    config = dataclasses.replace(
        config_for(deep_dirs, requests, force_rotation=True),
        remap=RemapConfig(enabled=True, cap_fraction=0.0),
        async_scheduling=async_scheduling,
    )
    engine = TorchEngine(deep_dirs, config, device=CPU, force_rotation=True, force_remap=0)
    statics = install_static(engine)
    remapper = engine.core.remapper
    assert remapper is not None and isinstance(remapper.controller, ForcedRemap)
    counts = iter([0, 0, 0, 2, 3, 0, 0, 0, 0, 4, 0, 0, 0, 0] * 4)
    ids = [
        engine.add_request(m, p, dataclasses.replace(GREEDY, max_tokens=n)) for m, p, n in requests
    ]
    done = {}
    while not engine.core.is_idle():
        remapper.controller.layers = next(counts, 0)
        done.update((o.request_id, o) for o in engine.step())
        if not async_scheduling:  # else the executor is a plan behind the remapper
            assert_frames_agree(engine)
    assert [done[i].output_ids for i in ids] == expected
    assert engine.totals.rotations > 0 and engine.totals.layers_streamed > 0
    static_passes = sum(s.num_passes for s in statics)
    assert static_passes > 0
    # Prefills and the steps that streamed layers ran eager.
    assert static_passes < engine.totals.steps * len(statics)


class _FakeGraph:
    """Stands in for ``torch.cuda.CUDAGraph`` where CUDA is missing: counts replays."""

    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1

    def pool(self) -> str:
        return "pool"


def test_each_layout_gets_its_graphs_and_the_most_recent_are_kept(
    deep_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bookkeeping of captured graphs, with CUDA's capture replaced (its passes run
    eagerly inside): a graph per bucket and layout, captured once, replayed after; a
    layout the frames move to gets its own; the ``MAX_LAYOUTS`` most recent stay."""
    pools = []

    @contextlib.contextmanager
    def capture(graph: _FakeGraph, *, pool: object, capture_error_mode: str) -> Iterator[None]:
        assert capture_error_mode == "thread_local"
        pools.append(pool)
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", capture)
    requests = work(2, seed=1)
    engine = TorchEngine(deep_dirs, config_for(deep_dirs, requests), device=CPU)
    served = engine.executor.models["tiny-llama"]
    assert served.frames is not None
    # Its layers from the arena's frames, its KV in a cache of its own.
    cache = new_cache(served.model, 4, BLOCK_TOKENS)
    static = StaticDecode(served.model, cache, BLOCK_TOKENS, max_batch=8, frames=served.frames)
    static.captured = True  # as capture() leaves it
    step = [SequenceChunk([5], 9, [3, 2, 1], samples=True)]
    assert static.run(step).shape[0] == 1
    static.run(step)
    static.run(step * 3)  # bucket 4
    assert (static.num_captures, static.num_replays) == (2, 3)
    # Swap two layers' frames, as a restore into another frame leaves them, and back.
    frame_of = served.frames.frame_of
    home = dict(frame_of)
    layouts = [home]
    for other in range(1, NUM_LAYERS):
        moved = dict(home)
        moved[0], moved[other] = home[other], home[0]
        layouts.append(moved)
    for layout in layouts[: MAX_LAYOUTS + 1]:
        frame_of.clear()
        frame_of.update(layout)
        static.run(step)
    # Home, then MAX_LAYOUTS others: home's graphs went, each other layout has one.
    assert static.num_captures == 2 + MAX_LAYOUTS
    frame_of.clear()
    frame_of.update(home)
    static.run(step)
    assert static.num_captures == 3 + MAX_LAYOUTS  # captured again
    assert pools == [None] + ["pool"] * (2 + MAX_LAYOUTS)  # one memory pool


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_graphs_replay_the_eager_logits_on_cuda(tiny_dirs: dict[str, Path]) -> None:
    """Captured once, replayed for two batches of different sizes and tables."""
    loaded = load_model(tiny_dirs["tiny-llama"], device=torch.device("cuda"))
    model = Transformer(loaded.arch, loaded.weights)
    cache, chunks = prefilled(model, 6, spare_blocks=12)
    static = StaticDecode(model, cache, BLOCK_TOKENS, max_batch=8, max_context=MAX_CONTEXT)
    before = cache.clone()
    static.capture()
    assert torch.equal(cache, before)  # warm-up and capture wrote no KV
    eager_cache = cache.clone()
    for step in (chunks, chunks[:3]):
        expected = eager_logits(model, eager_cache, step)
        torch.testing.assert_close(static.run(step), expected, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(cache, eager_cache, rtol=1e-4, atol=1e-4)
    assert static.num_replays == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_engine_replays_graphs_and_keeps_every_token(deep_dirs: dict[str, Path]) -> None:
    cuda = torch.device("cuda")
    requests = work(8, seed=6)
    eager_config = dataclasses.replace(config_for(deep_dirs, requests), enforce_eager=True)
    eager = TorchEngine(deep_dirs, eager_config, device=cuda)
    assert all(s.static is None for s in eager.executor.models.values())
    expected = run(eager, requests)
    engine = TorchEngine(deep_dirs, config_for(deep_dirs, requests), device=cuda)
    assert run(engine, requests) == expected
    replays = [s.static.num_replays for s in engine.executor.models.values() if s.static]
    assert len(replays) == 2 and all(r > 0 for r in replays)
