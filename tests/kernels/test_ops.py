"""The engine's kernel entry points: the reference on CPU tensors, Triton on CUDA ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.engine.exec.batch import ForwardBatch, SequenceChunk
from shunter.engine.exec.loader import load_model
from shunter.engine.exec.model import Transformer, kv_block_shape
from shunter.kernels import kv_blocks, ops
from shunter.kernels import paged_attention as reference
from tests.kernels.triton_cases import DEVICE, LAYER, cuda_only, needs_triton, paged_batch


def test_cpu_tensors_take_the_reference_bit_for_bit() -> None:
    case = paged_batch(
        [(4, 12), (1, 30)],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_tokens=8,
        device=torch.device("cpu"),
    )
    assert not ops.uses_triton(case.cache)
    expected = case.cache.clone()
    ops.write_kv(case.cache, LAYER, case.key, case.value, case.plan)
    reference.write_kv(expected, LAYER, case.key, case.value, case.plan)
    assert torch.equal(case.cache, expected)
    out = ops.paged_attention(case.query, case.cache, LAYER, case.plan, case.scale)
    assert torch.equal(
        out, reference.paged_attention(case.query, expected, LAYER, case.plan, case.scale)
    )

    ids = torch.tensor([3, 1])
    staging, want = torch.zeros(2, *case.cache.shape[1:]), torch.zeros(2, *case.cache.shape[1:])
    ops.gather_blocks(case.cache, ids, staging)
    kv_blocks.gather_blocks(case.cache, ids, want)
    assert torch.equal(staging, want)
    ops.scatter_blocks(case.cache, torch.tensor([0, 2]), staging)
    assert torch.equal(case.cache[[0, 2]], case.cache[[3, 1]])


@cuda_only
@pytest.mark.gpu
def test_cuda_tensors_take_triton() -> None:
    assert ops.uses_triton(torch.empty(1, device="cuda"))


def test_the_environment_can_keep_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    ops.triton_importable.cache_clear()
    monkeypatch.setenv("SHUNTER_KERNELS", "reference")
    try:
        assert not ops.triton_importable()
    finally:
        ops.triton_importable.cache_clear()


@needs_triton
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-mistral"])
def test_a_model_forward_through_triton_equals_the_reference(
    preset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefill chunks then a mixed step (a chunk and a decode), with the model's own
    strided q/k/v views; tiny-mistral's window (24) is shorter than the context."""
    model_dir = init_model_dir(tmp_path / preset, config=preset_config(preset), seed=0)
    loaded = load_model(model_dir, device=DEVICE, dtype=torch.float32)
    model = Transformer(loaded.arch, loaded.weights)
    ids = torch.randint(0, 200, (45,), generator=torch.Generator().manual_seed(0)).tolist()
    long_table, short_table = list(range(12))[::-1], [12, 13]
    steps = [
        [
            SequenceChunk(ids[:30], 0, long_table, True),
            SequenceChunk(ids[:7], 0, short_table, True),
        ],
        [
            SequenceChunk(ids[30:], 30, long_table, True),
            SequenceChunk(ids[7:8], 7, short_table, True),
        ],
    ]
    logits = []
    for triton in (False, True):
        monkeypatch.setattr(ops, "uses_triton", lambda _tensor, on=triton: on)
        cache = torch.zeros(14, *kv_block_shape(model.arch, 4), device=DEVICE)
        for chunks in steps:
            batch = ForwardBatch.build(
                chunks, block_tokens=4, device=DEVICE, sliding_window=model.arch.sliding_window
            )
            logits.append(model.forward(batch, cache))
    reference_logits, triton_logits = torch.cat(logits[:2]), torch.cat(logits[2:])
    torch.testing.assert_close(triton_logits, reference_logits, atol=1e-4, rtol=1e-4)
