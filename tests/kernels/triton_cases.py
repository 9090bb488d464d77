"""Shared by the Triton kernel tests: which device they run on, and random paged batches."""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass

import pytest
import torch

from shunter.kernels.paged_attention import PagedAttentionPlan, plan_paged_attention

HAS_TRITON = importlib.util.find_spec("triton") is not None
ON_CUDA = torch.cuda.is_available()
INTERPRETED = not ON_CUDA and os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")

needs_triton = pytest.mark.skipif(
    not HAS_TRITON or not (ON_CUDA or INTERPRETED),
    reason="needs Triton, and a CUDA device or TRITON_INTERPRET=1",
)
cuda_only = pytest.mark.skipif(not (HAS_TRITON and ON_CUDA), reason="needs a CUDA device")

NUM_LAYERS = 2
LAYER = 1


@dataclass
class PagedBatch:
    """A cache with every sequence's prefix written, this step's new K/V and queries."""

    cache: torch.Tensor
    plan: PagedAttentionPlan
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    scale: float


def paged_batch(
    batch: list[tuple[int, int]],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_tokens: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device = DEVICE,
    sliding_window: int | None = None,
    decode_partition_tokens: int = 512,
    num_blocks: int | None = None,
    seed: int = 0,
) -> PagedBatch:
    """Sequences of (new tokens, context length); blocks handed out in shuffled order from
    the top of a cache of ``num_blocks`` (default: just enough, plus 3 never used).

    The prefix of each sequence is random in its blocks; unused slots hold NaN-free
    random data too, so a kernel reading past a sequence's end changes the result."""
    gen = torch.Generator().manual_seed(seed)
    need = [math.ceil(ctx / block_tokens) for _, ctx in batch]
    total = num_blocks or sum(need) + 3
    top = torch.arange(total - sum(need) - 3, total)
    order = top[torch.randperm(len(top), generator=gen)].tolist()
    tables = [order[sum(need[:s]) : sum(need[: s + 1])] for s in range(len(batch))]
    block = (NUM_LAYERS, 2, block_tokens, num_kv_heads, head_dim)
    cache = torch.empty(total, *block, dtype=dtype, device=device)
    used = top.to(device)
    cache[used] = torch.randn(len(top), *block, generator=gen).to(dtype).to(device)
    plan = plan_paged_attention(
        query_lens=[q for q, _ in batch],
        context_lens=[c for _, c in batch],
        block_tables=tables,
        block_tokens=block_tokens,
        device=device,
        sliding_window=sliding_window,
        decode_partition_tokens=decode_partition_tokens,
    )
    num_tokens = plan.num_tokens

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    return PagedBatch(
        cache=cache,
        plan=plan,
        query=rand(num_tokens, num_heads, head_dim),
        key=rand(num_tokens, num_kv_heads, head_dim),
        value=rand(num_tokens, num_kv_heads, head_dim),
        scale=head_dim**-0.5,
    )
