"""The tensors of one forward pass, built once per step from the batch's sequences."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from shunter.kernels.paged_attention import PagedAttentionPlan, plan_paged_attention


@dataclass(frozen=True)
class SequenceChunk:
    """One sequence's share of a forward pass.

    Its ``token_ids`` sit at positions ``[start, start + len(token_ids))``: a prefill
    chunk, or one token when decoding. The KV of positions before ``start`` is already
    in the blocks of ``block_table``, which must cover the new tokens too. ``samples``
    asks for the logits after its last token.
    """

    token_ids: Sequence[int]
    start: int
    block_table: Sequence[int]
    samples: bool


@dataclass(frozen=True)
class ForwardBatch:
    """Packed inputs: every chunk's tokens back to back, their positions, the attention
    plan every layer reuses, and the packed index of each sampling chunk's last token."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attention: PagedAttentionPlan
    sample_index: torch.Tensor

    @classmethod
    def build(
        cls,
        chunks: Sequence[SequenceChunk],
        *,
        block_tokens: int,
        device: torch.device,
        sliding_window: int | None = None,
    ) -> ForwardBatch:
        if any(not c.token_ids or c.start < 0 for c in chunks):
            raise ValueError("every chunk needs at least one token and a start >= 0")
        ids = [t for c in chunks for t in c.token_ids]
        positions = [c.start + i for c in chunks for i in range(len(c.token_ids))]
        ends, total = [], 0
        for c in chunks:
            total += len(c.token_ids)
            if c.samples:
                ends.append(total - 1)
        attention = plan_paged_attention(
            query_lens=[len(c.token_ids) for c in chunks],
            context_lens=[c.start + len(c.token_ids) for c in chunks],
            block_tables=[c.block_table for c in chunks],
            block_tokens=block_tokens,
            device=device,
            sliding_window=sliding_window,
        )
        return cls(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            attention=attention,
            sample_index=torch.tensor(ends, dtype=torch.int64, device=device),
        )
