"""The Triton paged attention and write_kv equal the reference over a grid of shapes.

On CPU the kernels run in Triton's interpreter with small sizes (fp32 and fp16: the
interpreter's bf16 dot is not faithful); on a CUDA device also bf16, larger batches and
a cache whose element offsets pass 2**31.
"""

from __future__ import annotations

import pytest
import torch

from shunter.kernels import paged_attention as reference
from tests.kernels.triton_cases import (
    LAYER,
    PagedBatch,
    cuda_only,
    needs_triton,
    paged_batch,
)

pytestmark = needs_triton

# (new tokens, context length after them) per sequence: one-token sequences, prefills
# with and without a cached prefix, decodes and prefills mixed, block boundaries.
BATCHES = [
    [(1, 1)],
    [(1, 33)],
    [(5, 5)],
    [(16, 16), (1, 32)],
    [(3, 20), (1, 15), (17, 17), (1, 1)],
    [(1, 64), (1, 31), (33, 65)],
]

FP32 = {"atol": 1e-4, "rtol": 1e-4}
HALF = {"atol": 1e-2, "rtol": 1e-2}


def triton_and_reference(case: PagedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Both write the new K/V into their own copy of the cache, then attend."""
    from shunter.kernels import triton_paged_attention as tri

    ref_cache = case.cache.clone()
    reference.write_kv(ref_cache, LAYER, case.key, case.value, case.plan)
    tri.write_kv(case.cache, LAYER, case.key, case.value, case.plan)
    torch.testing.assert_close(case.cache, ref_cache, atol=0, rtol=0)
    expected = reference.paged_attention(case.query, ref_cache, LAYER, case.plan, case.scale)
    out = tri.paged_attention(case.query, case.cache, LAYER, case.plan, case.scale)
    assert out.dtype == case.query.dtype and out.shape == case.query.shape
    return out.float(), expected.float()


@pytest.mark.parametrize("batch", BATCHES, ids=str)
@pytest.mark.parametrize("block_tokens", [8, 16, 32])
def test_batches_across_block_sizes(batch: list[tuple[int, int]], block_tokens: int) -> None:
    case = paged_batch(batch, num_heads=8, num_kv_heads=2, head_dim=64, block_tokens=block_tokens)
    out, expected = triton_and_reference(case)
    torch.testing.assert_close(out, expected, **FP32)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize(
    "heads", [(4, 4), (8, 2), (6, 1), (14, 2)], ids=lambda h: f"h{h[0]}kv{h[1]}"
)
def test_heads_and_head_dims(heads: tuple[int, int], head_dim: int) -> None:
    case = paged_batch(
        [(3, 20), (1, 15), (18, 18)],
        num_heads=heads[0],
        num_kv_heads=heads[1],
        head_dim=head_dim,
        block_tokens=16,
    )
    out, expected = triton_and_reference(case)
    torch.testing.assert_close(out, expected, **FP32)


@pytest.mark.parametrize("partition", [16, 32, 48])
def test_split_k_decode_over_partitions(partition: int) -> None:
    # Contexts of 1..5 partitions and one shorter than a partition, in one batch.
    case = paged_batch(
        [(1, 150), (1, 9), (1, 64), (1, 65), (4, 40)],
        num_heads=4,
        num_kv_heads=1,
        head_dim=64,
        block_tokens=8,
        decode_partition_tokens=partition,
    )
    out, expected = triton_and_reference(case)
    torch.testing.assert_close(out, expected, **FP32)


@pytest.mark.parametrize("window", [1, 5, 40])
def test_sliding_window(window: int) -> None:
    case = paged_batch(
        [(9, 40), (1, 23), (30, 30), (1, 100)],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_tokens=8,
        sliding_window=window,
        decode_partition_tokens=16,
    )
    out, expected = triton_and_reference(case)
    torch.testing.assert_close(out, expected, **FP32)


def test_half_precision_cache() -> None:
    case = paged_batch(
        [(1, 40), (20, 33)],
        num_heads=8,
        num_kv_heads=2,
        head_dim=128,
        block_tokens=16,
        dtype=torch.float16,
        decode_partition_tokens=32,
    )
    out, expected = triton_and_reference(case)
    torch.testing.assert_close(out, expected, **HALF)


def test_write_kv_reads_strided_key_and_value_views() -> None:
    """The model passes K and V as views into its fused qkv projection."""
    from shunter.kernels import triton_paged_attention as tri

    case = paged_batch([(3, 10), (1, 6)], num_heads=4, num_kv_heads=2, head_dim=64, block_tokens=8)
    qkv = torch.randn(case.plan.num_tokens, 8 * 64, device=case.cache.device)
    _, key, value = torch.split(qkv, [4 * 64, 2 * 64, 2 * 64], dim=-1)
    key, value = key.view(-1, 2, 64), value.view(-1, 2, 64)
    assert not key.is_contiguous()
    expected = case.cache.clone()
    reference.write_kv(expected, LAYER, key, value, case.plan)
    tri.write_kv(case.cache, LAYER, key, value, case.plan)
    assert torch.equal(case.cache, expected)


def test_rejects_what_the_reference_rejects() -> None:
    from shunter.kernels import triton_paged_attention as tri

    case = paged_batch([(2, 9)], num_heads=4, num_kv_heads=2, head_dim=64, block_tokens=8)
    with pytest.raises(ValueError, match="key/value must be"):
        tri.write_kv(case.cache, LAYER, case.key[:1], case.value[:1], case.plan)
    with pytest.raises(ValueError, match="out of range"):
        tri.paged_attention(case.query, case.cache, 2, case.plan, case.scale)
    with pytest.raises(ValueError, match="cannot share"):
        tri.paged_attention(case.query[:, :3], case.cache, LAYER, case.plan, case.scale)
    with pytest.raises(AssertionError, match="contiguous last dimension"):
        tri.paged_attention(
            case.query.transpose(1, 2).contiguous().transpose(1, 2),
            case.cache,
            LAYER,
            case.plan,
            case.scale,
        )


@cuda_only
@pytest.mark.gpu
@pytest.mark.parametrize("block_tokens", [8, 16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(32, 8), (28, 4), (16, 16)], ids=lambda h: f"h{h[0]}kv{h[1]}")
def test_bf16_on_cuda(block_tokens: int, head_dim: int, heads: tuple[int, int]) -> None:
    batch = [(1, 1), (1, 700), (1, 2049), (200, 200), (37, 1100), (1, 17)]
    case = paged_batch(
        batch,
        num_heads=heads[0],
        num_kv_heads=heads[1],
        head_dim=head_dim,
        block_tokens=block_tokens,
        dtype=torch.bfloat16,
    )
    out, expected = triton_and_reference(case)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


@cuda_only
@pytest.mark.gpu
def test_offsets_past_two_to_the_31_on_cuda() -> None:
    # 65,536 elements per block: blocks from 32,768 on start past 2**31 elements.
    num_blocks = 34_000
    case = paged_batch(
        [(1, 300), (40, 90), (1, 1)],
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_tokens=16,
        dtype=torch.bfloat16,
        num_blocks=num_blocks,
        decode_partition_tokens=128,
    )
    assert case.cache[0].numel() * 32_768 >= 2**31
    assert int(case.plan.slot_blocks.min()) >= 32_768  # every sequence's blocks are up there
    out, expected = triton_and_reference(case)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("window", [None, 20], ids=["full", "window"])
@pytest.mark.parametrize("partition", [16, 512], ids=["split", "one-partition"])
def test_a_static_decode_plan_with_padding_rows(partition: int, window: int | None) -> None:
    """Decodes padded to a bucket, every table as wide as the plan's (stale ids past a
    sequence's blocks), a grid over the whole width: both implementations give the
    regular plan's attention for the real rows, and padding rows write no KV."""
    from shunter.kernels import triton_paged_attention as tri

    contexts, pads, max_blocks, block_tokens = [1, 9, 64, 65, 150], 3, 24, 8
    case = paged_batch(
        [(1, c) for c in contexts],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_tokens=block_tokens,
        sliding_window=window,
        decode_partition_tokens=partition,
    )
    n, size = len(contexts), len(contexts) + pads
    stale = case.cache.shape[0] - 1
    tables = torch.full((size, max_blocks), stale, dtype=torch.int32)
    for s in range(n):
        width = int(case.plan.table_lens[s])
        tables[s, :width] = case.plan.tables[s, :width].to(torch.int32)
    device = case.cache.device
    plan = reference.static_decode_plan(
        num_seqs=size,
        max_blocks=max_blocks,
        block_tokens=block_tokens,
        slot_blocks=torch.cat([case.plan.slot_blocks, torch.full((pads,), -1, device=device)]),
        slot_offsets=torch.cat([case.plan.slot_offsets, torch.zeros(pads, dtype=torch.int64)]),
        context_lens=torch.tensor(contexts + [1] * pads, dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        sliding_window=window,
        decode_partition_tokens=partition,
    )
    gen = torch.Generator().manual_seed(5)

    def padded(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, torch.randn(pads, *t.shape[1:], generator=gen).to(device)])

    query, key, value = padded(case.query), padded(case.key), padded(case.value)
    expected_cache = case.cache.clone()
    reference.write_kv(expected_cache, LAYER, case.key, case.value, case.plan)
    expected = reference.paged_attention(case.query, expected_cache, LAYER, case.plan, case.scale)
    for implementation in (reference, tri):
        cache = case.cache.clone()
        implementation.write_kv(cache, LAYER, key, value, plan)
        assert torch.equal(cache, expected_cache)
        out = implementation.paged_attention(query, cache, LAYER, plan, case.scale)
        assert out.shape == query.shape
        torch.testing.assert_close(out[:n], expected, **FP32)
