# Triton ships no type information, and kernel parameters take no annotations (Triton
# reads them as specialization hints): checked as untyped here, by the launchers' asserts.
# mypy: allow-untyped-defs, allow-incomplete-defs
# mypy: allow-untyped-decorators, allow-untyped-calls
"""Whole KV blocks between a block-first cache and a staging buffer: a Triton kernel.

Same arguments and results as :mod:`shunter.kernels.kv_blocks`. One program copies one
chunk of one block; block offsets are 64-bit, so caches past 2**31 elements work.
"""

from __future__ import annotations

import math

import torch
import triton  # type: ignore[import-untyped]
import triton.language as tl  # type: ignore[import-untyped]

from shunter.kernels.kv_blocks import check_blocks

CHUNK = 4096  # elements per program


@triton.jit
def _copy_blocks_kernel(
    kv_ptr, staging_ptr, block_ids_ptr, block_numel, GATHER: tl.constexpr, CHUNK: tl.constexpr
):
    i = tl.program_id(0).to(tl.int64)
    block = tl.load(block_ids_ptr + i).to(tl.int64)
    offsets = tl.program_id(1).to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    mask = offsets < block_numel
    cached = kv_ptr + block * block_numel + offsets
    staged = staging_ptr + i * block_numel + offsets
    if GATHER:
        tl.store(staged, tl.load(cached, mask=mask), mask=mask)
    else:
        tl.store(cached, tl.load(staged, mask=mask), mask=mask)


def gather_blocks(kv: torch.Tensor, block_ids: torch.Tensor, staging: torch.Tensor) -> None:
    """``staging[i] = kv[block_ids[i]]`` for every i."""
    _launch(kv, block_ids, staging, gather=True)


def scatter_blocks(kv: torch.Tensor, block_ids: torch.Tensor, staging: torch.Tensor) -> None:
    """``kv[block_ids[i]] = staging[i]`` for every i (ids distinct)."""
    _launch(kv, block_ids, staging, gather=False)


def _launch(
    kv: torch.Tensor, block_ids: torch.Tensor, staging: torch.Tensor, *, gather: bool
) -> None:
    check_blocks(kv, block_ids, staging)
    assert kv.is_contiguous() and staging.is_contiguous(), "blocks must be contiguous"
    assert block_ids.is_contiguous(), "block ids must be contiguous"
    if not len(block_ids):
        return
    block_numel = math.prod(kv.shape[1:])
    grid = (len(block_ids), triton.cdiv(block_numel, CHUNK))
    _copy_blocks_kernel[grid](kv, staging, block_ids, block_numel, GATHER=gather, CHUNK=CHUNK)
