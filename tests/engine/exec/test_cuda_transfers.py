"""Two-stream KV copies on a CUDA device: registered pinned host memory, batches, events."""

from __future__ import annotations

import gc

import pytest
import torch

from shunter.engine.exec.cuda_transfers import CudaTransfers, pinned_empty
from shunter.engine.exec.transfers import host_swap_space, make_transfers
from shunter.engine.plan import BlockCopies, StepPlan

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SHAPE = (2, 2, 4, 1, 8)  # layers, k|v, block tokens, kv heads, head dim
BLOCK_BYTES = 2 * 2 * 4 * 1 * 8 * 4


def numbered(num_blocks: int, offset: float = 0.0) -> torch.Tensor:
    """Blocks on the GPU whose every value is the block's id plus ``offset``."""
    ids = torch.arange(num_blocks, dtype=torch.float32, device="cuda") + offset
    return ids.view(-1, 1, 1, 1, 1, 1).expand(num_blocks, *SHAPE).contiguous()


def values(blocks: torch.Tensor) -> list[float]:
    """The value each block holds (blocks are uniform)."""
    return [float(b.flatten()[0]) for b in blocks.cpu()]


def registered(host: torch.Tensor) -> bool:
    """Whether the driver holds ``host``'s whole range as one registration: it unregisters
    at the tensor's first byte, and the range registers again. (Torch's ``is_pinned``
    knows only its own pinned allocator's memory on some versions, so it is no test of a
    registration. Registering a range that is already registered would leave the error
    pending for the next kernel launch, so the check goes the other way round.)"""
    cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    if int(cudart.cudaHostUnregister(host.data_ptr())) != 0:
        return False
    nbytes = host.numel() * host.element_size()
    return int(cudart.cudaHostRegister(host.data_ptr(), nbytes, 0)) == 0


def test_pinned_host_memory_is_registered_whole_and_copies_span_it() -> None:
    # 3 GiB and a little: a copy of all of it crosses what would be chunk boundaries.
    n = (3 << 30) // 4 + 1027
    host = pinned_empty((n,), torch.float32)
    assert registered(host)
    host.fill_(2.0)
    device = host.to("cuda", non_blocking=True)
    device.mul_(3.0)
    host.copy_(device, non_blocking=True)
    torch.cuda.synchronize()
    assert float(host[:: 1 << 20].sum()) == 6.0 * len(host[:: 1 << 20]) and float(host[-1]) == 6.0
    del host, device
    gc.collect()  # unregisters (after a device synchronize)


def test_swap_space_on_cuda_is_pinned() -> None:
    host = host_swap_space(10 * BLOCK_BYTES, SHAPE, torch.float32, pin=True)
    assert host.shape == (10, *SHAPE) and registered(host)


def test_cuda_kv_gets_the_two_stream_transfers() -> None:
    host = host_swap_space(4 * BLOCK_BYTES, SHAPE, torch.float32, pin=True)
    assert isinstance(make_transfers({"m": numbered(4)}, {"m": host}), CudaTransfers)


def test_blocks_go_out_and_come_back_in_batches_larger_than_the_staging() -> None:
    device = numbered(12)
    host = host_swap_space(8 * BLOCK_BYTES, SHAPE, torch.float32, pin=True)
    # Two blocks of staging: five copies take three rounds each way.
    transfers = CudaTransfers({"m": device}, {"m": host}, staging_bytes=2 * BLOCK_BYTES)
    out, rotate = BlockCopies([7, 2, 9], [3, 0, 1]), BlockCopies([4, 0], [6, 2])
    transfers.submit(StepPlan(step=0, swap_out={"m": out}, rotate={"m": rotate}))
    transfers.synchronize()
    assert transfers.poll(0.0) == [0]
    assert values(host[[3, 0, 1, 6, 2]]) == [7.0, 2.0, 9.0, 4.0, 0.0]

    into = BlockCopies([10, 11, 5], [3, 0, 6])
    transfers.submit(StepPlan(step=1, swapped_in=["r"], swap_in={"m": into}))
    transfers.synchronize()
    assert transfers.poll(0.0) == [1]
    assert values(device) == [0, 1, 2, 3, 4, 4, 6, 7, 8, 9, 7, 2]


def test_both_directions_in_one_step_and_steps_reported_in_order() -> None:
    device = numbered(8)
    host = host_swap_space(8 * BLOCK_BYTES, SHAPE, torch.float32, pin=True)
    host[4:6] = numbered(2, offset=40.0).cpu()
    transfers = CudaTransfers({"m": device}, {"m": host})
    transfers.submit(
        StepPlan(
            step=5,
            swap_out={"m": BlockCopies([1, 2], [0, 1])},
            swap_in={"m": BlockCopies([6, 7], [4, 5])},
            swapped_in=["r"],
        )
    )
    transfers.submit(StepPlan(step=6))  # no copies: reported after step 5, not before
    transfers.synchronize()
    assert transfers.poll(0.0) == [5, 6]
    assert transfers.poll(1.0) == []
    assert values(host[:2]) == [1.0, 2.0]
    assert values(device[6:]) == [40.0, 41.0]


def test_the_compute_stream_reads_a_swapped_in_block_only_after_its_copy() -> None:
    num_blocks = 256  # enough bytes that the copy is still running when the read is queued
    shape = (num_blocks, 64, 2, 16, 8, 128)
    device = torch.zeros(shape, dtype=torch.bfloat16, device="cuda")
    host = pinned_empty(shape, torch.bfloat16)
    host.fill_(3.0)
    transfers = CudaTransfers({"m": device}, {"m": host})
    copies = BlockCopies(list(range(num_blocks)), list(range(num_blocks)))
    transfers.submit(StepPlan(step=0, swapped_in=["r"], swap_in={"m": copies}))
    transfers.wait_swapped_in(["r"])
    landed = (device == 3.0).all()  # queued on the compute stream, after the wait
    assert bool(landed)
    transfers.synchronize()
    assert transfers.poll(0.0) == [0]
