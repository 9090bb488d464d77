"""The reference paged attention equals dense attention computed directly."""

from __future__ import annotations

import math

import pytest
import torch

from shunter.kernels.paged_attention import (
    PagedAttentionPlan,
    paged_attention,
    plan_paged_attention,
    write_kv,
)

NUM_LAYERS = 2
LAYER = 1

# Each case is a batch: (new tokens, context length after them) per sequence.
BATCHES = [
    [(1, 1)],
    [(1, 17)],
    [(5, 5)],
    [(16, 16), (1, 33)],
    [(3, 20), (1, 15), (7, 7), (1, 1)],
    [(1, 32), (1, 31), (33, 64)],
]


def dense_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention of the last ``len(query)`` positions over ``key``/``value``."""
    num_q, num_heads, _ = query.shape
    context, num_kv_heads, _ = key.shape
    group = num_heads // num_kv_heads
    key = key.repeat_interleave(group, dim=1).transpose(0, 1)
    value = value.repeat_interleave(group, dim=1).transpose(0, 1)
    scores = query.transpose(0, 1) @ key.transpose(1, 2) * scale
    q_pos = torch.arange(context - num_q, context)[:, None]
    k_pos = torch.arange(context)[None, :]
    allowed = k_pos <= q_pos
    if sliding_window is not None:
        allowed &= k_pos > q_pos - sliding_window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ value).transpose(0, 1)


def run_case(
    batch: list[tuple[int, int]],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_tokens: int,
    device: torch.device,
    dtype: torch.dtype,
    sliding_window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged and dense results for one batch, cache blocks handed out in shuffled order."""
    gen = torch.Generator().manual_seed(len(batch) * 1000 + head_dim + block_tokens)
    need = [math.ceil(ctx / block_tokens) for _, ctx in batch]
    num_blocks = sum(need) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [order[sum(need[:s]) : sum(need[: s + 1])] for s in range(len(batch))]
    cache = torch.zeros(
        num_blocks, NUM_LAYERS, 2, block_tokens, num_kv_heads, head_dim, dtype=dtype
    ).to(device)
    queries, new_keys, new_values, expected = [], [], [], []
    scale = head_dim**-0.5
    for (q_len, ctx), table in zip(batch, tables, strict=True):
        key = torch.randn(ctx, num_kv_heads, head_dim, generator=gen).to(dtype)
        value = torch.randn(ctx, num_kv_heads, head_dim, generator=gen).to(dtype)
        query = torch.randn(q_len, num_heads, head_dim, generator=gen).to(dtype)
        for pos in range(ctx - q_len):  # the cached prefix, written slot by slot
            block, slot = table[pos // block_tokens], pos % block_tokens
            cache[block, LAYER, 0, slot] = key[pos].to(device)
            cache[block, LAYER, 1, slot] = value[pos].to(device)
        queries.append(query)
        new_keys.append(key[ctx - q_len :])
        new_values.append(value[ctx - q_len :])
        expected.append(
            dense_attention(query.float(), key.float(), value.float(), scale, sliding_window)
        )
    plan = plan_paged_attention(
        query_lens=[q for q, _ in batch],
        context_lens=[c for _, c in batch],
        block_tables=tables,
        block_tokens=block_tokens,
        device=device,
        sliding_window=sliding_window,
    )
    write_kv(cache, LAYER, torch.cat(new_keys).to(device), torch.cat(new_values).to(device), plan)
    out = paged_attention(torch.cat(queries).to(device), cache, LAYER, plan, scale)
    return out.cpu().float(), torch.cat(expected)


@pytest.mark.parametrize("batch", BATCHES, ids=str)
@pytest.mark.parametrize("block_tokens", [1, 4, 16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (6, 1)], ids=lambda h: f"h{h[0]}kv{h[1]}")
def test_matches_dense_attention(
    batch: list[tuple[int, int]], block_tokens: int, head_dim: int, heads: tuple[int, int]
) -> None:
    out, expected = run_case(
        batch,
        num_heads=heads[0],
        num_kv_heads=heads[1],
        head_dim=head_dim,
        block_tokens=block_tokens,
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("window", [1, 5, 16])
def test_sliding_window_matches_dense_attention(window: int) -> None:
    out, expected = run_case(
        [(9, 40), (1, 23), (30, 30)],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_tokens=4,
        device=torch.device("cpu"),
        dtype=torch.float32,
        sliding_window=window,
    )
    torch.testing.assert_close(out, expected)


def test_write_kv_touches_only_the_planned_slots() -> None:
    cache = torch.zeros(4, NUM_LAYERS, 2, 4, 1, 2)
    plan = plan_paged_attention(
        query_lens=[2],
        context_lens=[5],
        block_tables=[[3, 1]],
        block_tokens=4,
        device=torch.device("cpu"),
    )
    key = torch.tensor([[[1.0, 1.0]], [[2.0, 2.0]]])
    write_kv(cache, 0, key, -key, plan)
    # Positions 3 and 4: block 3 slot 3, then block 1 slot 0.
    assert cache[3, 0, 0, 3].tolist() == [[1.0, 1.0]]
    assert cache[1, 0, 0, 0].tolist() == [[2.0, 2.0]]
    assert cache[1, 0, 1, 0].tolist() == [[-2.0, -2.0]]
    assert int(cache.ne(0).sum()) == 8
    assert cache[:, 1].abs().sum() == 0


def test_plan_is_shared_by_layers_and_separates_decodes_from_prefills() -> None:
    plan = plan_paged_attention(
        query_lens=[1, 6, 1],
        context_lens=[9, 6, 3],
        block_tables=[[0, 1, 2], [3, 4], [5]],
        block_tokens=4,
        device=torch.device("cpu"),
    )
    assert isinstance(plan, PagedAttentionPlan)
    assert [tuple(g.token_index.shape) for g in plan.groups] == [(2, 1), (1, 6)]
    assert plan.slot_blocks.tolist() == [2, 3, 3, 3, 3, 4, 4, 5]
    assert plan.slot_offsets.tolist() == [0, 0, 1, 2, 3, 0, 1, 2]


@pytest.mark.parametrize(
    ("query_lens", "context_lens", "tables"),
    [([0], [3], [[0]]), ([4], [3], [[0]]), ([1], [9], [[0, 1]]), ([1, 1], [1], [[0], [1]])],
)
def test_plan_rejects_inconsistent_lengths(
    query_lens: list[int], context_lens: list[int], tables: list[list[int]]
) -> None:
    with pytest.raises(ValueError):
        plan_paged_attention(
            query_lens=query_lens,
            context_lens=context_lens,
            block_tables=tables,
            block_tokens=4,
            device=torch.device("cpu"),
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_matches_dense_attention_on_cuda_in_bf16(batch: list[tuple[int, int]]) -> None:
    out, expected = run_case(
        batch,
        num_heads=8,
        num_kv_heads=2,
        head_dim=128,
        block_tokens=16,
        device=torch.device("cuda"),
        dtype=torch.bfloat16,
    )
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
