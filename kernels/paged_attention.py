"""Paged attention over the block-first KV layout: the pure-torch reference (CPU and GPU).

A model's KV cache is one tensor view ``[num_blocks, num_layers, 2, block_tokens,
num_kv_heads, head_dim]`` (index 0 of the third axis is K, 1 is V). A sequence's block
table maps its token position ``p`` to block ``table[p // block_tokens]``, slot
``p % block_tokens``.

Per step, :func:`plan_paged_attention` turns the batch's lengths and block tables into
index tensors once (FlashInfer's plan/run split); every layer then calls
:func:`write_kv` and :func:`paged_attention` with that plan. A batch packs the new tokens
of all sequences back to back: prefill chunks attend causally to the tokens cached
before them and to each other, decodes are chunks of one token. Triton kernels take the
same arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.nn.functional as F

KV_CACHE_DIMS = 6  # [num_blocks, num_layers, k|v, block_tokens, num_kv_heads, head_dim]


@dataclass(frozen=True)
class AttentionGroup:
    """Sequences attended together, padded to a common query and context length.

    ``token_index[s, i]`` is the packed position of sequence s's i-th new token (padding
    repeats its last token), ``block_tables`` its padded block table, ``mask[s, 0, 0, i,
    j]`` whether that query sees context position j. ``valid_index`` selects the real
    queries from the flattened ``[seqs * max_query]`` rows, in packed order, and
    ``tokens`` are their packed positions.
    """

    token_index: torch.Tensor
    block_tables: torch.Tensor
    mask: torch.Tensor
    valid_index: torch.Tensor
    tokens: torch.Tensor

    def to(self, device: torch.device) -> AttentionGroup:
        return AttentionGroup(
            token_index=self.token_index.to(device),
            block_tables=self.block_tables.to(device),
            mask=self.mask.to(device),
            valid_index=self.valid_index.to(device),
            tokens=self.tokens.to(device),
        )


# Split-K: a decode's context is attended in partitions of this many tokens, combined by
# a reduction when there is more than one (vLLM's paged attention v2 uses the same size).
DECODE_PARTITION_TOKENS = 512
# Prefill chunks are attended in tiles of this many queries (a kernel program each).
PREFILL_TILE_QUERIES = 16


@dataclass(frozen=True)
class KernelMetadata:
    """One step's batch as the Triton kernels read it, on the plan's device (int32).

    ``query_starts[s]`` is sequence s's first packed token (``[num_seqs + 1]``, the last
    entry the token count), ``context_lens[s]`` its length once this step's tokens are
    cached, ``block_tables[s]`` its block table padded with block 0 (never read: every
    read is bounded by the context length). ``decode_seqs`` lists the sequences with one
    new token, ``prefill_tiles[i] = (s, q)`` the tiles of :data:`PREFILL_TILE_QUERIES`
    queries of the others, q the tile's first query within the chunk.
    ``max_decode_context`` sizes the split-K grid.
    """

    query_starts: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    decode_seqs: torch.Tensor
    prefill_tiles: torch.Tensor
    max_decode_context: int


@dataclass(frozen=True)
class PagedAttentionPlan:
    """One step's attention metadata, shared by every layer.

    ``slot_blocks[t]`` and ``slot_offsets[t]`` are where packed token t's K and V go.
    The rest is host data from which each implementation derives, at its first layer
    and once per step, what it reads: :attr:`groups` for the reference,
    :attr:`kernel_metadata` for the Triton kernels.
    """

    block_tokens: int
    num_tokens: int
    slot_blocks: torch.Tensor
    slot_offsets: torch.Tensor
    device: torch.device
    sliding_window: int | None
    decode_partition_tokens: int
    # Host (CPU) int64 tensors: per sequence, and per packed token.
    query_lens: torch.Tensor = field(repr=False)
    context_lens: torch.Tensor = field(repr=False)
    table_lens: torch.Tensor = field(repr=False)
    tables: torch.Tensor = field(repr=False)
    positions: torch.Tensor = field(repr=False)
    # A static decode plan (:func:`static_decode_plan`): device metadata only.
    static: KernelMetadata | None = field(default=None, repr=False)

    @cached_property
    def groups(self) -> tuple[AttentionGroup, ...]:
        """The reference's groups: decodes and prefill chunks apart, so a long prefill
        chunk does not pad every decode to its length."""
        is_decode = self.query_lens == 1
        return tuple(
            self._group(torch.nonzero(is_decode == wanted).flatten()).to(self.device)
            for wanted in (True, False)
            if bool((is_decode == wanted).any())
        )

    @cached_property
    def kernel_metadata(self) -> KernelMetadata:
        if self.static is not None:
            return self.static
        q_lens = self.query_lens
        decode_seqs = torch.nonzero(q_lens == 1).flatten()
        prefill_seqs = torch.nonzero(q_lens > 1).flatten()
        num_tiles = (q_lens[prefill_seqs] + PREFILL_TILE_QUERIES - 1) // PREFILL_TILE_QUERIES
        tile_seq = torch.repeat_interleave(prefill_seqs, num_tiles)
        first_tile = torch.cumsum(num_tiles, 0) - num_tiles
        tile_index = torch.arange(len(tile_seq)) - torch.repeat_interleave(first_tile, num_tiles)
        tiles = torch.stack([tile_seq, tile_index * PREFILL_TILE_QUERIES], dim=1)
        starts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(q_lens, 0)])
        decode_ctx = self.context_lens[decode_seqs]
        return KernelMetadata(
            query_starts=starts.to(torch.int32).to(self.device),
            context_lens=self.context_lens.to(torch.int32).to(self.device),
            block_tables=self.tables.to(torch.int32).to(self.device),
            decode_seqs=decode_seqs.to(torch.int32).to(self.device),
            prefill_tiles=tiles.to(torch.int32).to(self.device),
            max_decode_context=int(decode_ctx.max()) if len(decode_ctx) else 0,
        )

    def _group(self, index: torch.Tensor) -> AttentionGroup:
        lens = self.query_lens[index]
        cu_q = torch.cumsum(self.query_lens, 0) - self.query_lens
        max_q = int(lens.max())
        steps = torch.arange(max_q)
        valid = steps[None, :] < lens[:, None]
        # Padding rows repeat the sequence's last query, so no row is fully masked (no NaN).
        token_index = cu_q[index, None] + torch.minimum(steps[None, :], lens[:, None] - 1)
        query_pos = self.positions[token_index]
        tables = self.tables[index, : int(self.table_lens[index].max())]
        context = torch.arange(tables.shape[1] * self.block_tokens)
        # Positions past a sequence's length are later than all its queries: masked here.
        mask = context[None, None, :] <= query_pos[:, :, None]
        if self.sliding_window is not None:
            mask &= context[None, None, :] > query_pos[:, :, None] - self.sliding_window
        return AttentionGroup(
            token_index=token_index,
            block_tables=tables,
            mask=mask[:, None, None],
            valid_index=torch.nonzero(valid.flatten()).flatten(),
            tokens=token_index[valid],
        )


def plan_paged_attention(
    *,
    query_lens: Sequence[int],
    context_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_tokens: int,
    device: torch.device,
    sliding_window: int | None = None,
    decode_partition_tokens: int = DECODE_PARTITION_TOKENS,
) -> PagedAttentionPlan:
    """Index tensors for a batch whose sequence s brings ``query_lens[s]`` new tokens.

    ``context_lens[s]`` counts the sequence's tokens once this step's are cached (the
    new ones are its last ``query_lens[s]``); its block table must cover them.
    ``sliding_window`` limits each query to that many most recent positions, its own
    included. ``decode_partition_tokens`` is the split-K partition of the Triton decode.
    """
    if not (len(query_lens) == len(context_lens) == len(block_tables)) or not query_lens:
        raise ValueError("need one query length, context length and block table per sequence")
    for q_len, ctx_len, table in zip(query_lens, context_lens, block_tables, strict=True):
        if not 1 <= q_len <= ctx_len:
            raise ValueError(f"need 1 <= query_len <= context_len, got {q_len}, {ctx_len}")
        if len(table) * block_tokens < ctx_len:
            raise ValueError(f"block table of {len(table)} blocks cannot hold {ctx_len} tokens")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
    if decode_partition_tokens < 1:
        raise ValueError(f"decode_partition_tokens must be >= 1, got {decode_partition_tokens}")
    q_lens = torch.tensor(query_lens, dtype=torch.int64)
    ctx_lens = torch.tensor(context_lens, dtype=torch.int64)
    starts = ctx_lens - q_lens
    cu_q = torch.cumsum(q_lens, 0) - q_lens
    seq_of_token = torch.repeat_interleave(torch.arange(len(query_lens)), q_lens)
    positions = starts[seq_of_token] + torch.arange(int(q_lens.sum())) - cu_q[seq_of_token]
    tables = _padded_tables(block_tables, range(len(block_tables)))
    slot_blocks = tables[seq_of_token, positions // block_tokens]
    return PagedAttentionPlan(
        block_tokens=block_tokens,
        num_tokens=int(q_lens.sum()),
        slot_blocks=slot_blocks.to(device),
        slot_offsets=(positions % block_tokens).to(device),
        device=device,
        sliding_window=sliding_window,
        decode_partition_tokens=decode_partition_tokens,
        query_lens=q_lens,
        context_lens=ctx_lens,
        table_lens=torch.tensor([len(t) for t in block_tables], dtype=torch.int64),
        tables=tables,
        positions=positions,
    )


def static_decode_plan(
    *,
    num_seqs: int,
    max_blocks: int,
    block_tokens: int,
    slot_blocks: torch.Tensor,
    slot_offsets: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    sliding_window: int | None = None,
    decode_partition_tokens: int = DECODE_PARTITION_TOKENS,
) -> PagedAttentionPlan:
    """A plan of ``num_seqs`` decodes whose every input lives in device tensors the
    caller fills before each use, so a CUDA graph captured over it stays valid: its
    shapes, its launch grids and its buffers' addresses never change.

    Sequence s writes its token's K and V at ``(slot_blocks[s], slot_offsets[s])``
    (nothing when ``slot_blocks[s] < 0``: a padding row), attends to its first
    ``context_lens[s]`` positions through the int32 ``block_tables[s]`` (``[num_seqs,
    max_blocks]``), and is the s-th packed token. The decode grid covers
    ``max_blocks * block_tokens`` positions whatever the lengths; partitions past a
    sequence's context do no work.
    """
    device = slot_blocks.device
    if block_tables.shape != (num_seqs, max_blocks) or block_tables.dtype != torch.int32:
        raise ValueError(f"block_tables must be int32 [{num_seqs}, {max_blocks}]")
    for name, t in (("slot_blocks", slot_blocks), ("slot_offsets", slot_offsets)):
        if t.shape != (num_seqs,):
            raise ValueError(f"{name} must be [{num_seqs}], got {tuple(t.shape)}")
    if context_lens.shape != (num_seqs,) or context_lens.dtype != torch.int32:
        raise ValueError(f"context_lens must be int32 [{num_seqs}]")
    seqs = torch.arange(num_seqs, dtype=torch.int32, device=device)
    metadata = KernelMetadata(
        query_starts=torch.arange(num_seqs + 1, dtype=torch.int32, device=device),
        context_lens=context_lens,
        block_tables=block_tables,
        decode_seqs=seqs,
        prefill_tiles=torch.empty((0, 2), dtype=torch.int32, device=device),
        max_decode_context=max_blocks * block_tokens,
    )
    ones = torch.ones(num_seqs, dtype=torch.int64)
    return PagedAttentionPlan(
        block_tokens=block_tokens,
        num_tokens=num_seqs,
        slot_blocks=slot_blocks,
        slot_offsets=slot_offsets,
        device=device,
        sliding_window=sliding_window,
        decode_partition_tokens=decode_partition_tokens,
        query_lens=ones,
        context_lens=ones,
        table_lens=ones,
        tables=torch.zeros((num_seqs, 1), dtype=torch.int64),
        positions=torch.zeros(num_seqs, dtype=torch.int64),
        static=metadata,
    )


def _padded_tables(block_tables: Sequence[Sequence[int]], seqs: Sequence[int]) -> torch.Tensor:
    """Block tables of ``seqs`` as one tensor, short ones padded with block 0 (masked)."""
    width = max(len(block_tables[s]) for s in seqs)
    rows = [list(block_tables[s]) + [0] * (width - len(block_tables[s])) for s in seqs]
    return torch.tensor(rows, dtype=torch.int64)


def write_kv(
    kv_cache: torch.Tensor,
    layer: int,
    key: torch.Tensor,
    value: torch.Tensor,
    plan: PagedAttentionPlan,
) -> None:
    """Scatter this step's ``[num_tokens, num_kv_heads, head_dim]`` K and V into the cache."""
    check_write_kv(kv_cache, layer, key, value, plan)
    blocks, offsets = plan.slot_blocks, plan.slot_offsets
    if plan.static is not None:  # padding rows (a negative block) write nothing
        real = blocks >= 0
        blocks, offsets, key, value = blocks[real], offsets[real], key[real], value[real]
    kv_cache[blocks, layer, 0, offsets] = key.to(kv_cache.dtype)
    kv_cache[blocks, layer, 1, offsets] = value.to(kv_cache.dtype)


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    layer: int,
    plan: PagedAttentionPlan,
    scale: float,
) -> torch.Tensor:
    """Attention of ``[num_tokens, num_heads, head_dim]`` queries over the cached K/V.

    Query head h reads KV head ``h // (num_heads // num_kv_heads)`` (GQA). The new
    tokens' K and V must already be written (:func:`write_kv`). Scores and softmax are
    computed in float32; the result has the query's dtype.
    """
    group_size = check_attention(query, kv_cache, layer, plan)
    _, num_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[4]
    layer_cache = kv_cache[:, layer]  # [num_blocks, 2, block_tokens, kv_heads, head_dim]
    if plan.static is not None:
        return _static_decode(query, layer_cache, plan, plan.static, scale)
    out = torch.empty_like(query)
    for group in plan.groups:
        num_seqs, max_q = group.token_index.shape
        key, value = _context_kv(layer_cache, group.block_tables)
        context = key.shape[2]
        # [seqs, kv_heads, group_size * max_q, head_dim]: a KV head's query group is
        # one run of rows, so the fused attention (one pass of scores, mask, softmax
        # and weighted sum, without the scores in memory) serves GQA as it is.
        q = query[group.token_index].float()
        q = q.view(num_seqs, max_q, num_kv_heads, group_size, head_dim).permute(0, 2, 3, 1, 4)
        rows = group_size * max_q
        mask = group.mask.expand(num_seqs, 1, group_size, max_q, context)
        result = F.scaled_dot_product_attention(
            q.reshape(num_seqs, num_kv_heads, rows, head_dim),
            key,
            value,
            attn_mask=mask.reshape(num_seqs, 1, rows, context),
            scale=scale,
        )
        result = result.view(num_seqs, num_kv_heads, group_size, max_q, head_dim)
        result = result.permute(0, 3, 1, 2, 4).reshape(num_seqs * max_q, num_heads, head_dim)
        out[group.tokens] = result[group.valid_index].to(query.dtype)
    return out


def _context_kv(
    layer_cache: torch.Tensor, tables: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 K and V of every position of ``tables``' blocks, ``[seqs, kv_heads,
    context, head_dim]``, gathered from one layer's cache."""
    blocks = layer_cache[tables].float()
    num_seqs, width, _, block_tokens, num_kv_heads, head_dim = blocks.shape
    shape = (num_seqs, width * block_tokens, num_kv_heads, head_dim)
    key = blocks[:, :, 0].reshape(shape).permute(0, 2, 1, 3)
    value = blocks[:, :, 1].reshape(shape).permute(0, 2, 1, 3)
    return key, value


def _static_decode(
    query: torch.Tensor,
    layer_cache: torch.Tensor,
    plan: PagedAttentionPlan,
    meta: KernelMetadata,
    scale: float,
) -> torch.Tensor:
    """Decode attention read from a static plan's device metadata alone: every
    sequence over its whole table width, masked past its context length."""
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = layer_cache.shape[3]
    group_size = num_heads // num_kv_heads
    key, value = _context_kv(layer_cache, meta.block_tables.long())
    context = key.shape[2]
    position = meta.context_lens.long()[:, None] - 1  # each query's own position
    seen = torch.arange(context, device=query.device)[None, :]
    mask = seen <= position
    if plan.sliding_window is not None:
        mask &= seen > position - plan.sliding_window
    q = query.float().view(num_seqs, num_kv_heads, group_size, head_dim)
    result = F.scaled_dot_product_attention(
        q, key, value, attn_mask=mask[:, None, None, :], scale=scale
    )
    return result.reshape(num_seqs, num_heads, head_dim).to(query.dtype)


def check_write_kv(
    kv_cache: torch.Tensor,
    layer: int,
    key: torch.Tensor,
    value: torch.Tensor,
    plan: PagedAttentionPlan,
) -> None:
    """Raise ``ValueError`` unless :func:`write_kv` can take these arguments: a cache
    the plan and ``layer`` fit, K and V of ``[num_tokens, num_kv_heads, head_dim]``."""
    _check_kv_cache(kv_cache, layer, plan)
    expected = (plan.num_tokens, kv_cache.shape[4], kv_cache.shape[5])
    if key.shape != expected or value.shape != expected:
        raise ValueError(f"key/value must be {expected}, got {key.shape} and {value.shape}")


def check_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, layer: int, plan: PagedAttentionPlan
) -> int:
    """Raise ``ValueError`` unless :func:`paged_attention` can take these arguments: a
    cache the plan and ``layer`` fit, queries of ``[num_tokens, num_heads, head_dim]``
    whose heads the KV heads divide. Return the GQA group size (query heads per KV
    head)."""
    _check_kv_cache(kv_cache, layer, plan)
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[4]
    if num_tokens != plan.num_tokens or head_dim != kv_cache.shape[5]:
        raise ValueError(f"query {tuple(query.shape)} does not match the plan or the cache")
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads cannot share {num_kv_heads} KV heads")
    return num_heads // num_kv_heads


def _check_kv_cache(kv_cache: torch.Tensor, layer: int, plan: PagedAttentionPlan) -> None:
    """Raise ``ValueError`` unless ``kv_cache`` is a block-first cache the plan and
    ``layer`` fit."""
    if kv_cache.dim() != KV_CACHE_DIMS or kv_cache.shape[2] != 2:
        raise ValueError(
            "kv_cache must be [num_blocks, num_layers, 2, block_tokens, kv_heads, head_dim], "
            f"got {tuple(kv_cache.shape)}"
        )
    if kv_cache.shape[3] != plan.block_tokens:
        raise ValueError(f"cache blocks hold {kv_cache.shape[3]} tokens, plan {plan.block_tokens}")
    if not 0 <= layer < kv_cache.shape[1]:
        raise ValueError(f"layer {layer} out of range for {kv_cache.shape[1]} layers")
