"""Per-layer compute time of a model, measured on the executor's own forward pass.

``measure_model`` loads a model directory (random weights from ``shunter model init``
time exactly like trained ones), and for each shape builds the batch the executor would
(``ForwardBatch``: every sequence's blocks its own, so attention reads as much KV as it
would serving) and runs ``Transformer.forward`` with a ``LayerSource`` that marks when
each decoder layer starts and ends: CUDA events on the compute stream, or the host
clock on CPU, where every kernel runs as it is called.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from shunter.engine.calibrate.device import synchronize
from shunter.engine.config import ModelSpec
from shunter.engine.exec.batch import ForwardBatch, SequenceChunk
from shunter.engine.exec.loader import LayerWeights, load_model
from shunter.engine.exec.model import Transformer, kv_block_shape

Kind = Literal["decode", "prefill"]
Mark = float | torch.cuda.Event


@dataclass(frozen=True)
class Shape:
    """``batch`` sequences each computing ``tokens`` new tokens on top of ``context``
    cached ones: a decode step (``tokens == 1``) or a prefill chunk."""

    kind: Kind
    batch: int
    tokens: int
    context: int

    def __post_init__(self) -> None:
        if self.batch < 1 or self.tokens < 1 or self.context < 0:
            raise ValueError(f"shape needs batch, tokens >= 1 and context >= 0: {self}")

    def num_blocks(self, block_tokens: int) -> int:
        return self.batch * math.ceil((self.context + self.tokens) / block_tokens)


@dataclass(frozen=True)
class LayerPoint:
    """Times in seconds of one measured ``shape``, medians over repeats: ``t_layer_s``
    one decoder layer (mean over the layers of a pass); ``t_forward_s`` the forward
    pass (layers, embedding, head); ``t_step_s`` the step around it on the host clock
    (building the batch, the pass, greedy sampling, waiting for the device)."""

    shape: Shape
    t_layer_s: float
    t_forward_s: float
    t_step_s: float


@dataclass(frozen=True)
class ModelTimings:
    """What ``measure_model`` found for one model; ``skipped`` are the shapes it could not
    run, each with why (longer than the model's context, or more KV than the budget)."""

    spec: ModelSpec
    model_dir: Path
    dtype: torch.dtype
    block_tokens: int
    points: tuple[LayerPoint, ...]
    skipped: tuple[tuple[Shape, str], ...]


class TimedLayers:
    """A ``LayerSource`` over resident layers that marks each layer's start and end."""

    def __init__(self, layers: list[LayerWeights], device: torch.device) -> None:
        self.layers = layers
        self.device = device
        self.starts: list[Mark] = []
        self.ends: list[Mark] = []

    def mark(self) -> Mark:
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(self.device))
        return event

    def acquire(self, index: int) -> LayerWeights:
        self.starts.append(self.mark())
        return self.layers[index]

    def release(self, index: int) -> None:
        self.ends.append(self.mark())

    def layer_seconds(self) -> list[float]:
        """Each layer's seconds, in order; on CUDA once the pass has run."""
        return [between(a, b) for a, b in zip(self.starts, self.ends, strict=True)]


def between(start: Mark, end: Mark) -> float:
    """Seconds from ``start`` to ``end`` (two host times or two recorded CUDA events)."""
    if isinstance(start, float) and isinstance(end, float):
        return end - start
    assert isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event)
    end.synchronize()
    return float(start.elapsed_time(end)) / 1e3


def measure_model(
    model_dir: Path,
    spec: ModelSpec,
    shapes: Sequence[Shape],
    *,
    device: torch.device,
    block_tokens: int,
    kv_budget_bytes: int,
    repeats: int,
) -> ModelTimings:
    """Time every shape of ``shapes`` that fits the model's context and whose KV fits in
    ``kv_budget_bytes`` on ``device`` (``spec`` describes the checkpoint, in its dtype)."""
    loaded = load_model(model_dir, device=device)
    model = Transformer(loaded.arch, loaded.weights)
    block_bytes = spec.block_bytes(block_tokens)
    points: list[LayerPoint] = []
    skipped: list[tuple[Shape, str]] = []
    for shape in shapes:
        kv_bytes = shape.num_blocks(block_tokens) * block_bytes
        if shape.context + shape.tokens > spec.max_context:
            skipped.append((shape, f"longer than the model's {spec.max_context} positions"))
            continue
        if kv_bytes > kv_budget_bytes:
            skipped.append((shape, f"KV of {kv_bytes} bytes over the {kv_budget_bytes} budget"))
            continue
        points.append(_measure_shape(model, shape, block_tokens=block_tokens, repeats=repeats))
    return ModelTimings(
        spec=spec,
        model_dir=model_dir,
        dtype=loaded.dtype,
        block_tokens=block_tokens,
        points=tuple(points),
        skipped=tuple(skipped),
    )


def _measure_shape(
    model: Transformer, shape: Shape, *, block_tokens: int, repeats: int
) -> LayerPoint:
    device = model.device
    blocks_per_seq = shape.num_blocks(block_tokens) // shape.batch
    cache = torch.zeros(
        (shape.num_blocks(block_tokens), *kv_block_shape(model.arch, block_tokens)),
        dtype=model.dtype,
        device=device,
    )
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.arch.vocab_size, (shape.batch, shape.tokens), generator=gen)
    chunks = [
        SequenceChunk(
            token_ids=ids[i].tolist(),
            start=shape.context,
            block_table=list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)),
            samples=True,
        )
        for i in range(shape.batch)
    ]
    runs = []
    for _ in range(repeats + 1):  # the first run is untimed: kernels compile, caches warm
        timed = TimedLayers(model.weights.layers, device)
        synchronize(device)
        t0 = time.perf_counter()
        batch = ForwardBatch.build(
            chunks,
            block_tokens=block_tokens,
            device=device,
            sliding_window=model.arch.sliding_window,
        )
        start = timed.mark()
        logits = model.forward(batch, cache, timed)
        end = timed.mark()
        logits.argmax(-1).tolist()  # greedy sampling; waits for the device
        t_step = time.perf_counter() - t0
        layers = timed.layer_seconds()
        runs.append((statistics.fmean(layers), between(start, end), t_step))
    runs = runs[1:]
    return LayerPoint(
        shape=shape,
        t_layer_s=statistics.median(r[0] for r in runs),
        t_forward_s=statistics.median(r[1] for r in runs),
        t_step_s=statistics.median(r[2] for r in runs),
    )
