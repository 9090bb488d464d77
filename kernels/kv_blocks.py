"""Whole KV blocks between a block-first cache and a contiguous staging buffer: the
pure-torch reference (CPU and GPU).

A cache ``[num_blocks, *block_shape]`` holds each block contiguously, so a batched
transfer gathers the blocks it sends into ``staging[: len(block_ids)]`` and scatters
the blocks it receives from there: one kernel per direction per step, then one copy of
the staging buffer between the tiers.
"""

from __future__ import annotations

import torch


def gather_blocks(kv: torch.Tensor, block_ids: torch.Tensor, staging: torch.Tensor) -> None:
    """``staging[i] = kv[block_ids[i]]`` for every i."""
    check_blocks(kv, block_ids, staging)
    torch.index_select(kv, 0, block_ids, out=staging[: len(block_ids)])


def scatter_blocks(kv: torch.Tensor, block_ids: torch.Tensor, staging: torch.Tensor) -> None:
    """``kv[block_ids[i]] = staging[i]`` for every i (ids distinct)."""
    check_blocks(kv, block_ids, staging)
    kv.index_copy_(0, block_ids, staging[: len(block_ids)])


def check_blocks(kv: torch.Tensor, block_ids: torch.Tensor, staging: torch.Tensor) -> None:
    """Raise ``ValueError`` unless the three fit: same block shape, dtype and device,
    a 1-D integer id per staged block, room for them all."""
    if staging.shape[1:] != kv.shape[1:] or staging.dtype != kv.dtype:
        raise ValueError(
            f"staging {tuple(staging.shape)} {staging.dtype} does not hold blocks of "
            f"{tuple(kv.shape)} {kv.dtype}"
        )
    if block_ids.dim() != 1 or block_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"block_ids must be a 1-D integer tensor, got {block_ids.dtype}")
    if len(block_ids) > staging.shape[0]:
        raise ValueError(f"{len(block_ids)} blocks do not fit {staging.shape[0]} staging slots")
    if not kv.device == staging.device == block_ids.device:
        raise ValueError("cache, staging and block ids must be on one device")
