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
from dataclasses import dataclass

import torch

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


@dataclass(frozen=True)
class PagedAttentionPlan:
    """One step's attention metadata, shared by every layer.

    ``slot_blocks[t]`` and ``slot_offsets[t]`` are where packed token t's K and V go.
    Decodes and prefill chunks form separate groups, so a long prefill chunk does not
    pad every decode to its length.
    """

    block_tokens: int
    num_tokens: int
    slot_blocks: torch.Tensor
    slot_offsets: torch.Tensor
    groups: tuple[AttentionGroup, ...]


def plan_paged_attention(
    *,
    query_lens: Sequence[int],
    context_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_tokens: int,
    device: torch.device,
    sliding_window: int | None = None,
) -> PagedAttentionPlan:
    """Index tensors for a batch whose sequence s brings ``query_lens[s]`` new tokens.

    ``context_lens[s]`` counts the sequence's tokens once this step's are cached (the
    new ones are its last ``query_lens[s]``); its block table must cover them.
    ``sliding_window`` limits each query to that many most recent positions, its own
    included.
    """
    if not (len(query_lens) == len(context_lens) == len(block_tables)) or not query_lens:
        raise ValueError("need one query length, context length and block table per sequence")
    for q_len, ctx_len, table in zip(query_lens, context_lens, block_tables, strict=True):
        if not 1 <= q_len <= ctx_len:
            raise ValueError(f"need 1 <= query_len <= context_len, got {q_len}, {ctx_len}")
        if len(table) * block_tokens < ctx_len:
            raise ValueError(f"block table of {len(table)} blocks cannot hold {ctx_len} tokens")
    q_lens = torch.tensor(query_lens, dtype=torch.int64)
    starts = torch.tensor(context_lens, dtype=torch.int64) - q_lens
    cu_q = torch.cumsum(q_lens, 0) - q_lens
    seq_of_token = torch.repeat_interleave(torch.arange(len(query_lens)), q_lens)
    positions = starts[seq_of_token] + torch.arange(int(q_lens.sum())) - cu_q[seq_of_token]
    tables = _padded_tables(block_tables, range(len(block_tables)))
    slot_blocks = tables[seq_of_token, positions // block_tokens]
    is_decode = [q == 1 for q in query_lens]
    groups = tuple(
        _plan_group(
            seqs=[s for s, decode in enumerate(is_decode) if decode is wanted],
            q_lens=q_lens,
            cu_q=cu_q,
            positions=positions,
            block_tables=block_tables,
            block_tokens=block_tokens,
            sliding_window=sliding_window,
        ).to(device)
        for wanted in (True, False)
        if wanted in is_decode
    )
    return PagedAttentionPlan(
        block_tokens=block_tokens,
        num_tokens=int(q_lens.sum()),
        slot_blocks=slot_blocks.to(device),
        slot_offsets=(positions % block_tokens).to(device),
        groups=groups,
    )


def _plan_group(
    *,
    seqs: list[int],
    q_lens: torch.Tensor,
    cu_q: torch.Tensor,
    positions: torch.Tensor,
    block_tables: Sequence[Sequence[int]],
    block_tokens: int,
    sliding_window: int | None,
) -> AttentionGroup:
    index = torch.tensor(seqs, dtype=torch.int64)
    lens = q_lens[index]
    max_q = int(lens.max())
    steps = torch.arange(max_q)
    valid = steps[None, :] < lens[:, None]
    # Padding rows repeat the sequence's last query, so no row is fully masked (no NaN).
    token_index = cu_q[index, None] + torch.minimum(steps[None, :], lens[:, None] - 1)
    query_pos = positions[token_index]
    tables = _padded_tables(block_tables, seqs)
    context = torch.arange(tables.shape[1] * block_tokens)
    # Positions past a sequence's length are later than all its queries: masked here.
    mask = context[None, None, :] <= query_pos[:, :, None]
    if sliding_window is not None:
        mask &= context[None, None, :] > query_pos[:, :, None] - sliding_window
    return AttentionGroup(
        token_index=token_index,
        block_tables=tables,
        mask=mask[:, None, None],
        valid_index=torch.nonzero(valid.flatten()).flatten(),
        tokens=token_index[valid],
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
    _check_cache(kv_cache, layer, plan)
    expected = (plan.num_tokens, kv_cache.shape[4], kv_cache.shape[5])
    if key.shape != expected or value.shape != expected:
        raise ValueError(f"key/value must be {expected}, got {key.shape} and {value.shape}")
    kv_cache[plan.slot_blocks, layer, 0, plan.slot_offsets] = key.to(kv_cache.dtype)
    kv_cache[plan.slot_blocks, layer, 1, plan.slot_offsets] = value.to(kv_cache.dtype)


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
    _check_cache(kv_cache, layer, plan)
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[4]
    if num_tokens != plan.num_tokens or head_dim != kv_cache.shape[5]:
        raise ValueError(f"query {tuple(query.shape)} does not match the plan or the cache")
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads cannot share {num_kv_heads} KV heads")
    group_size = num_heads // num_kv_heads
    layer_cache = kv_cache[:, layer]  # [num_blocks, 2, block_tokens, kv_heads, head_dim]
    out = torch.empty_like(query)
    for group in plan.groups:
        num_seqs, max_q = group.token_index.shape
        blocks = layer_cache[group.block_tables].float()
        context = blocks.shape[1] * blocks.shape[3]
        # [seqs, kv_heads, 1, context, head_dim]: one K/V head serves its query group.
        key = blocks[:, :, 0].reshape(num_seqs, context, num_kv_heads, head_dim)
        value = blocks[:, :, 1].reshape(num_seqs, context, num_kv_heads, head_dim)
        key = key.permute(0, 2, 1, 3)[:, :, None]
        value = value.permute(0, 2, 1, 3)[:, :, None]
        # [seqs, kv_heads, group_size, max_q, head_dim]
        q = query[group.token_index].float()
        q = q.view(num_seqs, max_q, num_kv_heads, group_size, head_dim).permute(0, 2, 3, 1, 4)
        scores = torch.matmul(q, key.transpose(-1, -2)) * scale
        scores = scores.masked_fill(~group.mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        result = torch.matmul(probs, value).permute(0, 3, 1, 2, 4)
        result = result.reshape(num_seqs * max_q, num_heads, head_dim)
        out[group.tokens] = result[group.valid_index].to(query.dtype)
    return out


def _check_cache(kv_cache: torch.Tensor, layer: int, plan: PagedAttentionPlan) -> None:
    if kv_cache.dim() != KV_CACHE_DIMS or kv_cache.shape[2] != 2:
        raise ValueError(
            "kv_cache must be [num_blocks, num_layers, 2, block_tokens, kv_heads, head_dim], "
            f"got {tuple(kv_cache.shape)}"
        )
    if kv_cache.shape[3] != plan.block_tokens:
        raise ValueError(f"cache blocks hold {kv_cache.shape[3]} tokens, plan {plan.block_tokens}")
    if not 0 <= layer < kv_cache.shape[1]:
        raise ValueError(f"layer {layer} out of range for {kv_cache.shape[1]} layers")
