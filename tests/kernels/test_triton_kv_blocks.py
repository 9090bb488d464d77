"""The Triton block gather/scatter equals the reference: whole blocks, any order."""

from __future__ import annotations

import pytest
import torch

from shunter.kernels import kv_blocks
from tests.kernels.triton_cases import DEVICE, cuda_only, needs_triton

pytestmark = needs_triton


def blocks(num_blocks: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(num_blocks)
    return torch.randn(num_blocks, *shape, generator=gen).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 2, 8, 2, 64), (1, 2, 3, 1, 5)], ids=str)
def test_gather_then_scatter_equal_the_reference(
    shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    from shunter.kernels import triton_kv_blocks

    kv = blocks(12, shape, dtype)
    ids = torch.tensor([7, 0, 11, 3], device=DEVICE)
    staging = torch.zeros(6, *shape, dtype=dtype, device=DEVICE)
    expected = staging.clone()
    triton_kv_blocks.gather_blocks(kv, ids, staging)
    kv_blocks.gather_blocks(kv, ids, expected)
    assert torch.equal(staging, expected)
    assert torch.equal(staging[:4], kv[ids]) and not staging[4:].any()

    target, want = torch.zeros_like(kv), torch.zeros_like(kv)
    triton_kv_blocks.scatter_blocks(target, ids.to(torch.int32), staging)
    kv_blocks.scatter_blocks(want, ids, staging)
    assert torch.equal(target, want)
    assert torch.equal(target[ids], kv[ids]) and not target[[1, 2, 4, 5, 6, 8, 9, 10]].any()


def test_no_blocks_is_a_no_op() -> None:
    from shunter.kernels import triton_kv_blocks

    kv = blocks(3, (2, 4), torch.float32)
    staging = torch.zeros(2, 2, 4, device=DEVICE)
    triton_kv_blocks.gather_blocks(kv, torch.tensor([], dtype=torch.int64, device=DEVICE), staging)
    assert not staging.any()


@pytest.mark.parametrize(
    ("staging_shape", "ids", "message"),
    [
        ((4, 2, 5), [0], "does not hold blocks"),
        ((1, 2, 4), [0, 1], "do not fit"),
        ((4, 2, 4), [[0]], "1-D integer"),
    ],
)
def test_rejects_mismatched_staging(
    staging_shape: tuple[int, ...], ids: list[int], message: str
) -> None:
    from shunter.kernels import triton_kv_blocks

    kv = blocks(3, (2, 4), torch.float32)
    staging = torch.zeros(*staging_shape, device=DEVICE)
    for gather in (kv_blocks.gather_blocks, triton_kv_blocks.gather_blocks):
        with pytest.raises(ValueError, match=message):
            gather(kv, torch.tensor(ids, device=DEVICE), staging)


@cuda_only
@pytest.mark.gpu
def test_blocks_past_two_to_the_31_elements_on_cuda() -> None:
    from shunter.kernels import triton_kv_blocks

    # 1 Mi elements (2 MiB in bf16) per block: block 2,048 starts at 2**31 elements.
    shape = (32, 2, 16, 8, 128)
    kv = torch.zeros(2_100, *shape, dtype=torch.bfloat16, device="cuda")
    ids = torch.tensor([2_099, 5, 2_048, 2_050], device="cuda")
    kv[ids] = torch.randn(4, *shape, device="cuda").to(torch.bfloat16)
    staging = torch.empty(4, *shape, dtype=torch.bfloat16, device="cuda")
    triton_kv_blocks.gather_blocks(kv, ids, staging)
    assert torch.equal(staging, kv[ids])
    back = torch.zeros_like(kv)
    triton_kv_blocks.scatter_blocks(back, ids, staging)
    assert torch.equal(back[ids], kv[ids])
    assert int(back.ne(0).sum()) == int(kv.ne(0).sum())
