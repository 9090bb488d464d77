# Triton ships no type information, and kernel parameters take no annotations (Triton
# reads them as specialization hints): checked as untyped here, by the launchers' asserts.
# mypy: allow-untyped-defs, allow-incomplete-defs
# mypy: allow-untyped-decorators, allow-untyped-calls
"""Paged attention over the block-first KV layout: Triton kernels.

Same arguments and results as :mod:`shunter.kernels.paged_attention` (the reference),
reading the plan's :class:`~shunter.kernels.paged_attention.KernelMetadata`, built once
per step. Each launcher asserts shapes, dtypes, strides and devices before launch.

- :func:`write_kv`: one program per new token scatters its K and V into its slot.
- Decodes (one new token): one program per (sequence, KV head, context partition)
  computes all of that KV head's query heads at once (GQA), so each K/V tile is read
  once; partitions of ``plan.decode_partition_tokens`` tokens (split-K) are combined by
  a reduction kernel when a context spans more than one.
- Prefill chunks: one program per (tile of queries, KV head, block of its query heads)
  attends causally to the chunk and to the cached prefix, with an online softmax.

A token's K/V address is found from its block table entry per token, so any block size
works. Addresses are computed in 64 bits from the block id on, so caches whose byte
offsets pass 2**31 are read correctly. Scores and softmax are float32; the result has
the query's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import triton  # type: ignore[import-untyped]
import triton.language as tl  # type: ignore[import-untyped]

from shunter.kernels.paged_attention import (
    PREFILL_TILE_QUERIES,
    KernelMetadata,
    PagedAttentionPlan,
    check_attention,
    check_write_kv,
)

DECODE_BLOCK_N = 64  # context tokens per inner step
PREFILL_BLOCK_N = 32
MIN_DOT = 16  # tile sides below this are padded (tensor-core shapes)
MAX_HEAD_BLOCK = 8  # query heads per prefill program (rows = tile queries x heads)

NO_WINDOW = 1 << 30  # the window of full attention: farther than any context
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_LOG2E = 1.4426950408889634


@triton.jit
def _write_kv_kernel(
    k_cache_ptr,
    v_cache_ptr,
    key_ptr,
    value_ptr,
    slot_blocks_ptr,
    slot_offsets_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    num_kv_heads,
    head_dim,
    HEADS_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    block = tl.load(slot_blocks_ptr + token).to(tl.int64)
    slot = tl.load(slot_offsets_ptr + token).to(tl.int64)
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_PAD)
    # A static plan's padding rows have block -1: they write nothing.
    heads = (h < num_kv_heads) & (h * 0 + block >= 0)
    mask = heads[:, None] & (d < head_dim)[None, :]
    block = tl.maximum(block, 0)
    dst = block * stride_cb + slot * stride_cs + h[:, None] * stride_ch + d[None, :]
    key = tl.load(key_ptr + token * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    value = tl.load(value_ptr + token * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    tl.store(k_cache_ptr + dst, key.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, value.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _attend(
    q,
    q_pos,
    start,
    end,
    k_ptr,
    v_ptr,
    kv_head,
    table_row_ptr,
    sliding_window,
    d,
    d_mask,
    block_tokens,
    stride_kb,
    stride_ks,
    stride_kh,
    scale_log2,
    ROWS: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Online softmax of the ``ROWS`` queries ``q`` over the context positions
    [start, end) of KV head ``kv_head``, whose blocks the table row lists. With
    ``CAUSAL``, row r sees the positions in (q_pos[r] - sliding_window, q_pos[r]];
    without, every row sees the whole range (decodes: the caller bounds it by the
    window). Returns the unnormalized output, each row's running max (log2 scale) and
    its sum of exponentials."""
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_PAD], tl.float32)
    k_head = k_ptr + kv_head.to(tl.int64) * stride_kh
    v_head = v_ptr + kv_head.to(tl.int64) * stride_kh
    for n in range(start, end, BLOCK_N):
        pos = n + tl.arange(0, BLOCK_N)
        in_range = pos < end
        if CAUSAL:
            visible = (pos[None, :] <= q_pos[:, None]) & (
                pos[None, :] > q_pos[:, None] - sliding_window
            )
            visible = visible & in_range[None, :]
        else:
            visible = in_range[None, :]
        block = tl.load(table_row_ptr + pos // block_tokens, mask=in_range, other=0).to(tl.int64)
        offset = block * stride_kb + (pos % block_tokens).to(tl.int64) * stride_ks
        kv_mask = in_range[:, None] & d_mask[None, :]
        k = tl.load(k_head + offset[:, None] + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_head + offset[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen nothing yet keeps m = -inf; shift by 0 so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _decode_kernel(
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    query_starts_ptr,
    context_lens_ptr,
    block_tables_ptr,
    decode_seqs_ptr,
    scale_log2,
    sliding_window,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_bt,
    block_tokens,
    head_dim,
    group_size,
    num_heads,
    partition_tokens,
    num_partitions,
    GROUP_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq = tl.load(decode_seqs_ptr + i)
    token = tl.load(query_starts_ptr + seq).to(tl.int64)
    ctx = tl.load(context_lens_ptr + seq)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_PAD)
    d_mask = d < head_dim
    heads = kv_head * group_size + g
    row_mask = g < group_size
    q = tl.load(
        q_ptr + token * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(k_ptr.dtype.element_ty)
    end = tl.minimum((part + 1) * partition_tokens, ctx)
    # The query sits at ctx - 1 and sees positions > ctx - 1 - window.
    start = tl.maximum(part * partition_tokens, ctx - sliding_window)
    acc, m_i, l_i = _attend(
        q, ctx - 1, start, end, k_ptr, v_ptr, kv_head,
        block_tables_ptr + seq.to(tl.int64) * stride_bt, sliding_window,
        d, d_mask, block_tokens, stride_kb, stride_ks, stride_kh, scale_log2,
        ROWS=GROUP_PAD, HEAD_PAD=HEAD_PAD, BLOCK_N=BLOCK_N, CAUSAL=False, PRECISION=PRECISION,
    )  # fmt: skip
    if SPLIT:
        # Unnormalized partials; an empty partition leaves m = -inf, l = 0, acc = 0.
        row = (i * num_heads + heads).to(tl.int64) * num_partitions + part
        tl.store(part_ml_ptr + row * 2, m_i, mask=row_mask)
        tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=row_mask)
        dst = part_acc_ptr + row[:, None] * head_dim + d[None, :]
        tl.store(dst, acc, mask=row_mask[:, None] & d_mask[None, :])
    else:
        out = acc / l_i[:, None]
        dst = out_ptr + token * stride_ot + heads[:, None] * stride_oh + d[None, :]
        tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


@triton.jit
def _decode_reduce_kernel(
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    query_starts_ptr,
    decode_seqs_ptr,
    stride_ot,
    stride_oh,
    head_dim,
    num_heads,
    num_partitions,
    PARTS_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    i = tl.program_id(0)
    head = tl.program_id(1)
    token = tl.load(query_starts_ptr + tl.load(decode_seqs_ptr + i)).to(tl.int64)
    p = tl.arange(0, PARTS_PAD)
    d = tl.arange(0, HEAD_PAD)
    p_mask = p < num_partitions
    row = (i * num_heads + head).to(tl.int64) * num_partitions + p
    m = tl.load(part_ml_ptr + row * 2, mask=p_mask, other=float("-inf"))
    l_p = tl.load(part_ml_ptr + row * 2 + 1, mask=p_mask, other=0.0)
    acc = tl.load(
        part_acc_ptr + row[:, None] * head_dim + d[None, :],
        mask=p_mask[:, None] & (d < head_dim)[None, :],
        other=0.0,
    )
    # Some partition holds the query's own position, so m_max is finite.
    m_max = tl.max(m, 0)
    weight = tl.exp2(m - m_max)
    out = tl.sum(acc * weight[:, None], 0) / tl.sum(l_p * weight, 0)
    dst = out_ptr + token * stride_ot + head * stride_oh + d
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=d < head_dim)


@triton.jit
def _prefill_kernel(
    out_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    query_starts_ptr,
    context_lens_ptr,
    block_tables_ptr,
    tiles_ptr,
    scale_log2,
    sliding_window,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_bt,
    block_tokens,
    head_dim,
    group_size,
    head_blocks,
    BLOCK_Q: tl.constexpr,
    HEAD_BLOCK: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1) // head_blocks
    head_block = tl.program_id(1) % head_blocks
    seq = tl.load(tiles_ptr + tile * 2)
    q_first = tl.load(tiles_ptr + tile * 2 + 1)
    q_start = tl.load(query_starts_ptr + seq)
    q_len = tl.load(query_starts_ptr + seq + 1) - q_start
    ctx = tl.load(context_lens_ptr + seq)
    prefix = ctx - q_len
    # Row r: query q_first + r // HEAD_BLOCK of the chunk, head_block's (r % HEAD_BLOCK)-th head.
    r = tl.arange(0, BLOCK_Q * HEAD_BLOCK)
    q_index = q_first + r // HEAD_BLOCK
    g = head_block * HEAD_BLOCK + r % HEAD_BLOCK
    row_mask = (q_index < q_len) & (g < group_size)
    heads = kv_head * group_size + g
    tokens = (q_start + q_index).to(tl.int64)
    d = tl.arange(0, HEAD_PAD)
    d_mask = d < head_dim
    io_mask = row_mask[:, None] & d_mask[None, :]
    q = tl.load(
        q_ptr + tokens[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=io_mask,
        other=0.0,
    ).to(k_ptr.dtype.element_ty)
    q_pos = prefix + q_index
    # Causal: nothing past the tile's last query; window: nothing before its first's reach.
    end = prefix + tl.minimum(q_first + BLOCK_Q, q_len)
    start = tl.maximum(prefix + q_first - sliding_window + 1, 0)
    acc, _, l_i = _attend(
        q, q_pos, start, end, k_ptr, v_ptr, kv_head,
        block_tables_ptr + seq.to(tl.int64) * stride_bt, sliding_window,
        d, d_mask, block_tokens, stride_kb, stride_ks, stride_kh, scale_log2,
        ROWS=BLOCK_Q * HEAD_BLOCK, HEAD_PAD=HEAD_PAD, BLOCK_N=BLOCK_N, CAUSAL=True,
        PRECISION=PRECISION,
    )  # fmt: skip
    # Padding rows saw nothing (l = 0); they are not stored.
    out = acc / tl.where(row_mask, l_i, 1.0)[:, None]
    dst = out_ptr + tokens[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=io_mask)


def write_kv(
    kv_cache: torch.Tensor,
    layer: int,
    key: torch.Tensor,
    value: torch.Tensor,
    plan: PagedAttentionPlan,
) -> None:
    """Scatter this step's ``[num_tokens, num_kv_heads, head_dim]`` K and V into the cache."""
    check_write_kv(kv_cache, layer, key, value, plan)
    _check_kernel_cache(kv_cache)
    _check_rows(key, "key", kv_cache.device)
    _check_rows(value, "value", kv_cache.device)
    assert plan.slot_blocks.device == kv_cache.device, "plan and cache on different devices"
    k_cache, v_cache = kv_cache[:, layer, 0], kv_cache[:, layer, 1]
    _write_kv_kernel[(plan.num_tokens,)](
        k_cache, v_cache, key, value, plan.slot_blocks, plan.slot_offsets,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        kv_cache.shape[4], kv_cache.shape[5],
        HEADS_PAD=triton.next_power_of_2(kv_cache.shape[4]),
        HEAD_PAD=triton.next_power_of_2(kv_cache.shape[5]),
    )  # fmt: skip


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    layer: int,
    plan: PagedAttentionPlan,
    scale: float,
) -> torch.Tensor:
    """Attention of ``[num_tokens, num_heads, head_dim]`` queries over the cached K/V.

    Query head h reads KV head ``h // (num_heads // num_kv_heads)`` (GQA). The new
    tokens' K and V must already be written (:func:`write_kv`). Queries are rounded to
    the cache's dtype for the products, as K and V are.
    """
    group_size = check_attention(query, kv_cache, layer, plan)
    _check_kernel_cache(kv_cache)
    _check_rows(query, "query", kv_cache.device)
    meta = plan.kernel_metadata
    tables = meta.block_tables
    assert tables.device == kv_cache.device, "plan and cache on different devices"
    assert tables.dtype == torch.int32 and tables.stride(1) == 1, "int32 rows of block ids"
    k_cache, v_cache = kv_cache[:, layer, 0], kv_cache[:, layer, 1]
    out = torch.empty_like(query)
    shape = _Shape(
        head_dim=query.shape[2],
        group_size=group_size,
        num_heads=query.shape[1],
        num_kv_heads=kv_cache.shape[4],
        scale_log2=scale * _LOG2E,
        sliding_window=plan.sliding_window or NO_WINDOW,
    )
    if len(meta.decode_seqs):
        _decode(out, query, k_cache, v_cache, plan, meta, shape)
    if len(meta.prefill_tiles):
        _prefill(out, query, k_cache, v_cache, plan, meta, shape)
    return out


@dataclass(frozen=True)
class _Shape:
    head_dim: int
    group_size: int
    num_heads: int
    num_kv_heads: int
    scale_log2: float
    sliding_window: int

    def common(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        plan: PagedAttentionPlan,
        meta: KernelMetadata,
        out: torch.Tensor,
    ) -> dict[str, Any]:
        """Launch arguments both attention kernels take."""
        return dict(
            stride_qt=query.stride(0), stride_qh=query.stride(1),
            stride_ot=out.stride(0), stride_oh=out.stride(1),
            stride_kb=k_cache.stride(0), stride_ks=k_cache.stride(1),
            stride_kh=k_cache.stride(2), stride_bt=meta.block_tables.stride(0),
            block_tokens=plan.block_tokens, head_dim=self.head_dim,
            group_size=self.group_size, scale_log2=self.scale_log2,
            sliding_window=self.sliding_window,
            HEAD_PAD=max(MIN_DOT, triton.next_power_of_2(self.head_dim)),
            # fp32 caches get fp32 products (tf32 would miss the reference's precision).
            PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32",
        )  # fmt: skip


def _decode(
    out: torch.Tensor,
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: PagedAttentionPlan,
    meta: KernelMetadata,
    shape: _Shape,
) -> None:
    num_decodes = len(meta.decode_seqs)
    partition = plan.decode_partition_tokens
    num_partitions = math.ceil(meta.max_decode_context / partition)
    split = num_partitions > 1
    if split:
        rows = (num_decodes, shape.num_heads, num_partitions)
        part_acc = torch.empty(*rows, shape.head_dim, dtype=torch.float32, device=out.device)
        part_ml = torch.empty(*rows, 2, dtype=torch.float32, device=out.device)
    else:
        part_acc = part_ml = out  # not touched: the kernel writes the result itself
    common = shape.common(query, k_cache, plan, meta, out)
    _decode_kernel[(num_decodes, shape.num_kv_heads, num_partitions)](
        out, part_acc, part_ml, query, k_cache, v_cache,
        meta.query_starts, meta.context_lens, meta.block_tables, meta.decode_seqs,
        num_heads=shape.num_heads, partition_tokens=partition, num_partitions=num_partitions,
        GROUP_PAD=max(MIN_DOT, triton.next_power_of_2(shape.group_size)),
        BLOCK_N=min(DECODE_BLOCK_N, max(MIN_DOT, triton.next_power_of_2(partition))),
        SPLIT=split, **common,
    )  # fmt: skip
    if split:
        _decode_reduce_kernel[(num_decodes, shape.num_heads)](
            out, part_acc, part_ml, meta.query_starts, meta.decode_seqs,
            out.stride(0), out.stride(1), shape.head_dim, shape.num_heads, num_partitions,
            PARTS_PAD=triton.next_power_of_2(num_partitions), HEAD_PAD=common["HEAD_PAD"],
        )  # fmt: skip


def _prefill(
    out: torch.Tensor,
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: PagedAttentionPlan,
    meta: KernelMetadata,
    shape: _Shape,
) -> None:
    # Rows are tile queries x query heads: with >= 16 queries a tile fills a dot's rows.
    head_block = min(MAX_HEAD_BLOCK, triton.next_power_of_2(shape.group_size))
    head_blocks = math.ceil(shape.group_size / head_block)
    _prefill_kernel[(len(meta.prefill_tiles), shape.num_kv_heads * head_blocks)](
        out, query, k_cache, v_cache,
        meta.query_starts, meta.context_lens, meta.block_tables, meta.prefill_tiles,
        head_blocks=head_blocks, BLOCK_Q=PREFILL_TILE_QUERIES, HEAD_BLOCK=head_block,
        BLOCK_N=PREFILL_BLOCK_N, **shape.common(query, k_cache, plan, meta, out),
    )  # fmt: skip


def _check_rows(t: torch.Tensor, name: str, device: torch.device) -> None:
    """``[tokens, heads, head_dim]`` rows with a unit last stride, on the cache's device."""
    assert t.dim() == 3, f"{name} must be [tokens, heads, head_dim], got {tuple(t.shape)}"
    assert t.stride(2) == 1, f"{name} needs a contiguous last dimension, strides {t.stride()}"
    assert t.device == device, f"{name} on {t.device}, the cache on {device}"
    assert t.dtype in KERNEL_DTYPES, f"{name} is {t.dtype}"


def _check_kernel_cache(kv_cache: torch.Tensor) -> None:
    assert kv_cache.stride(5) == 1, (
        f"cache needs a contiguous head_dim, strides {kv_cache.stride()}"
    )
    assert kv_cache.dtype in KERNEL_DTYPES, f"cache is {kv_cache.dtype}"
