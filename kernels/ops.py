"""The kernels the engine calls: Triton on CUDA tensors when Triton imports, the
pure-torch reference otherwise (CPU tensors, or no Triton). ``SHUNTER_KERNELS=reference``
in the environment keeps the reference on CUDA too (to compare, or to rule the kernels
out when debugging).

Each function takes the same arguments as its reference and gives the same results
(within float tolerance); the choice follows the cache tensor's device, per call.
"""

from __future__ import annotations

import functools
import importlib
import os

import torch

from shunter.kernels import kv_blocks
from shunter.kernels import paged_attention as reference
from shunter.kernels.paged_attention import PagedAttentionPlan


@functools.cache
def triton_importable() -> bool:
    """Whether Triton imports here (it may be installed yet fail without a driver) and
    the environment does not ask for the reference."""
    if os.environ.get("SHUNTER_KERNELS", "triton") == "reference":
        return False
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def uses_triton(tensor: torch.Tensor) -> bool:
    """Whether the calls below run the Triton kernels for a cache on ``tensor``'s device."""
    return tensor.is_cuda and triton_importable()


def write_kv(
    kv_cache: torch.Tensor,
    layer: int,
    key: torch.Tensor,
    value: torch.Tensor,
    plan: PagedAttentionPlan,
) -> None:
    """:func:`shunter.kernels.paged_attention.write_kv`."""
    if uses_triton(kv_cache):
        from shunter.kernels import triton_paged_attention

        triton_paged_attention.write_kv(kv_cache, layer, key, value, plan)
    else:
        reference.write_kv(kv_cache, layer, key, value, plan)


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    layer: int,
    plan: PagedAttentionPlan,
    scale: float,
) -> torch.Tensor:
    """:func:`shunter.kernels.paged_attention.paged_attention`."""
    if uses_triton(kv_cache):
        from shunter.kernels import triton_paged_attention

        return triton_paged_attention.paged_attention(query, kv_cache, layer, plan, scale)
    return reference.paged_attention(query, kv_cache, layer, plan, scale)


def gather_blocks(kv: torch.Tensor, block_ids: torch.Tensor, staging: torch.Tensor) -> None:
    """:func:`shunter.kernels.kv_blocks.gather_blocks`."""
    if uses_triton(kv):
        from shunter.kernels import triton_kv_blocks

        triton_kv_blocks.gather_blocks(kv, block_ids, staging)
    else:
        kv_blocks.gather_blocks(kv, block_ids, staging)


def scatter_blocks(kv: torch.Tensor, block_ids: torch.Tensor, staging: torch.Tensor) -> None:
    """:func:`shunter.kernels.kv_blocks.scatter_blocks`."""
    if uses_triton(kv):
        from shunter.kernels import triton_kv_blocks

        triton_kv_blocks.scatter_blocks(kv, block_ids, staging)
    else:
        kv_blocks.scatter_blocks(kv, block_ids, staging)
