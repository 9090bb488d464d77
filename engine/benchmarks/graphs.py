"""``shunter bench graphs``: a decode step replayed from CUDA graphs against eager.

For each batch size, decode steps of that many requests at ``context`` tokens each, run
through the model alone (no scheduler): the eager pass (the step's ``ForwardBatch``
built and the forward pass run, as the executor does) against the static pass
(``StaticDecode``: its buffers filled and its bucket's graph replayed). The device is
synchronized after every step; the figure is the median over ``rounds`` alternated runs
of ``steps`` steps each. On CUDA the static pass replays graphs; elsewhere it runs its
padded pass eagerly, so the ratio there is what the static buffers cost, not a saving.

The HBM roofline of a step is every byte it must read once (the decoder layers, the
final norm and LM head, the batch's KV) over the datasheet bandwidth of the device's
profile in ``engine/sim/hardware.py``, when the device's name matches one.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from shunter.engine.benchmarks.models import model_or_preset
from shunter.engine.calibrate.device import synchronize
from shunter.engine.exec.batch import ForwardBatch, SequenceChunk
from shunter.engine.exec.graphs import StaticDecode
from shunter.engine.exec.loader import ModelWeights, load_model
from shunter.engine.exec.model import Transformer, kv_block_shape
from shunter.engine.exec.sizing import BLOCK_TOKENS
from shunter.engine.sim.hardware import get_profile

PRESET = "small-llama"
# Device names as torch reports them, to the hardware profiles with their bandwidth.
PROFILES = (("GH200", "gh200"), ("H200", "h200"), ("H100", "h100"))


def bench_graphs(
    *,
    model_dir: Path | None = None,
    batches: Sequence[int] = (1, 16, 64, 256),
    context: int = 512,
    steps: int = 20,
    rounds: int = 3,
    threads: int | None = None,
    device: str = "cpu",
) -> Iterator[str]:
    """Yield the report's lines: per batch size, eager and static step times."""
    torch.set_num_threads(threads or os.cpu_count() or 1)
    dev = torch.device(device)
    with tempfile.TemporaryDirectory(prefix="shunter-bench-") as tmp:
        model_dir = yield from model_or_preset(tmp, model_dir, PRESET)
        loaded = load_model(model_dir, device=dev)
        model = Transformer(loaded.arch, loaded.weights)
        per_seq = -(-(context + 1) // BLOCK_TOKENS)
        shape = kv_block_shape(loaded.arch, BLOCK_TOKENS)
        kv = torch.zeros((max(batches) * per_seq, *shape), dtype=loaded.dtype, device=dev)
        static = StaticDecode(
            model, kv, BLOCK_TOKENS, max_batch=max(batches), max_context=per_seq * BLOCK_TOKENS
        )
        graphs = dev.type == "cuda"
        if graphs:
            t0 = time.perf_counter()
            static.capture()
            yield f"captured {static.num_captures} graphs in {time.perf_counter() - t0:.1f} s"
        bandwidth = _bandwidth(dev)
        yield (
            f"{model_dir.name} ({loaded.dtype}) on {device}, context {context} tokens; "
            f"static pass {'replays CUDA graphs' if graphs else 'eager (no CUDA graphs here)'}"
        )
        yield (
            "    batch    eager ms   static ms   eager/static"
            + ("   roofline ms   eager/roof  static/roof" if bandwidth else "")
        )
        for batch in batches:
            chunks = [
                SequenceChunk([4 + i % 100], context, range(i * per_seq, (i + 1) * per_seq), True)
                for i in range(batch)
            ]

            def eager(chunks: list[SequenceChunk] = chunks) -> None:
                step = ForwardBatch.build(
                    chunks,
                    block_tokens=BLOCK_TOKENS,
                    device=dev,
                    sliding_window=model.arch.sliding_window,
                )
                model.forward(step, kv)

            def replay(chunks: list[SequenceChunk] = chunks) -> None:
                static.run(chunks)

            t_eager, t_static = _alternated(eager, replay, dev, steps=steps, rounds=rounds)
            ratio = t_eager / t_static
            line = f"    {batch:5d}  {t_eager * 1e3:10.3f}  {t_static * 1e3:10.3f}  {ratio:13.2f}"
            if bandwidth:
                roof = _step_bytes(loaded.weights, kv, batch, context + 1) / bandwidth
                line += f"  {roof * 1e3:12.3f}  {t_eager / roof:10.2f}  {t_static / roof:11.2f}"
            yield line
        if not bandwidth:
            yield "    (no roofline: the device matches no hardware profile)"


def _alternated(
    a: Callable[[], None], b: Callable[[], None], device: torch.device, *, steps: int, rounds: int
) -> tuple[float, float]:
    """Median seconds a step of ``a`` and of ``b``, after a warm-up of each."""

    def timed(fn: Callable[[], None]) -> float:
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
            synchronize(device)
        return (time.perf_counter() - t0) / steps

    timed(a), timed(b)
    runs = [(timed(a), timed(b)) for _ in range(rounds)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def _step_bytes(weights: ModelWeights, kv: torch.Tensor, batch: int, context: int) -> int:
    """What a decode step reads at least: every decoder layer's tensors, the final norm
    and the LM head (the embedding reads one row a token), and each request's KV."""
    tensors: list[torch.Tensor] = [weights.lm_head, weights.final_norm]
    for layer in weights.layers:
        tensors.extend(t for t in vars(layer).values() if t is not None)
    per_token: int = kv[0].nbytes // kv.shape[3]  # one token of every layer, K and V
    return sum(t.nbytes for t in tensors) + batch * context * per_token


def _bandwidth(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for marker, profile in PROFILES:
        if marker in name:
            return get_profile(profile).hbm_bw
    return None
