"""Batched whole-block copies between the device KV and the host swap space."""

from __future__ import annotations

import pytest
import torch

from shunter.engine.exec.cuda_transfers import _by_host, _runs
from shunter.engine.exec.transfers import BlockingTransfers, host_swap_space, make_transfers
from shunter.engine.plan import BlockCopies, StepPlan

SHAPE = (2, 2, 4, 1, 8)  # layers, k|v, block tokens, kv heads, head dim


def numbered(num_blocks: int) -> torch.Tensor:
    """Blocks whose every value is the block's id."""
    return (
        torch.arange(num_blocks, dtype=torch.float32)
        .view(-1, 1, 1, 1, 1, 1)
        .expand(num_blocks, *SHAPE)
        .contiguous()
    )


def test_host_swap_holds_as_many_blocks_as_the_budget() -> None:
    block_bytes = 2 * 2 * 4 * 1 * 8 * 4
    host = host_swap_space(10 * block_bytes + 5, SHAPE, torch.float32, pin=False)
    assert host.shape == (10, *SHAPE) and host.dtype == torch.float32


def test_d2h_then_h2d_copy_whole_blocks_and_report_the_step() -> None:
    device = numbered(6)
    host = torch.zeros(4, *SHAPE)
    transfers = BlockingTransfers({"m": device}, {"m": host})
    out = StepPlan(
        step=3, swap_out={"m": BlockCopies([4], [0])}, rotate={"m": BlockCopies([1], [2])}
    )
    transfers.submit(out)
    assert host[0].unique().tolist() == [4.0] and host[2].unique().tolist() == [1.0]
    assert host[1].abs().sum() == 0 and host[3].abs().sum() == 0
    # The same step frees block 4 to host and refills it from host block 2: D2H first.
    both = StepPlan(
        step=4, swap_out={"m": BlockCopies([4], [3])}, swap_in={"m": BlockCopies([4], [2])}
    )
    transfers.submit(both)
    assert host[3].unique().tolist() == [4.0]
    assert device[4].unique().tolist() == [1.0]
    assert device[5].unique().tolist() == [5.0]
    assert transfers.poll(0.0) == [3, 4]
    assert transfers.poll(1.0) == []


def test_models_copy_into_their_own_host_space() -> None:
    a, b = numbered(3), numbered(3) + 10
    host_a, host_b = torch.zeros(2, *SHAPE), torch.zeros(2, *SHAPE)
    transfers = BlockingTransfers({"a": a, "b": b}, {"a": host_a, "b": host_b})
    out = {"a": BlockCopies([2], [0]), "b": BlockCopies([1], [0])}
    transfers.submit(StepPlan(step=0, swap_out=out))
    assert host_a[0].unique().tolist() == [2.0]
    assert host_b[0].unique().tolist() == [11.0]


def test_cpu_kv_gets_blocking_transfers() -> None:
    transfers = make_transfers({"m": numbered(2)}, {"m": torch.zeros(2, *SHAPE)})
    assert isinstance(transfers, BlockingTransfers)


def test_device_and_host_blocks_must_agree() -> None:
    with pytest.raises(ValueError, match="device and host blocks differ"):
        BlockingTransfers({"m": numbered(2)}, {"m": torch.zeros(2, 1, 2, 4, 1, 8)})


def test_host_copies_go_in_runs_of_consecutive_ids() -> None:
    assert list(_runs([])) == []
    assert list(_runs([3, 4, 5, 9, 11, 12])) == [(0, 3, 3), (3, 9, 1), (4, 11, 2)]


def test_cuda_batches_go_in_host_id_order_with_their_device_ids() -> None:
    devices, hosts = _by_host(BlockCopies([7, 2, 9, 4, 0], [3, 0, 1, 6, 2]))
    assert hosts == [0, 1, 2, 3, 6] and devices == [2, 9, 0, 7, 4]
    assert list(_runs(hosts)) == [(0, 0, 4), (4, 6, 1)]
    assert _by_host(BlockCopies()) == ([], [])
