"""KV block copies between the device arena and host swap space.

``KVTransfers`` is what the torch executor needs of a transfer engine beyond the
``Transfers`` interface: a way to order the forward pass after a swapped-in request's
copies. ``make_transfers`` picks the implementation for the device: overlapped copies on
two CUDA streams (``cuda_transfers.CudaTransfers``) on a GPU, ``BlockingTransfers``
otherwise.

Both move one batch per model and direction per step, never one copy per layer: whole
blocks are contiguous in the block-first layout.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch

from shunter.engine.exec.host_copy import copy_rows_on_this_thread
from shunter.engine.interfaces import Transfers
from shunter.engine.plan import BlockCopies, StepPlan


def host_swap_space(
    capacity_bytes: int, block_shape: tuple[int, ...], dtype: torch.dtype, *, pin: bool
) -> torch.Tensor:
    """A model's host swap tensor ``[num_blocks, *block_shape]``.

    ``HostSwap`` numbers each model's host blocks from 0 under one byte budget shared
    by all models, so one model never holds more than ``capacity_bytes`` of them. The
    space is left uninitialized: a host block is only read after a D2H copy wrote it.
    Pageable space is therefore only backed by memory where blocks were written, so the
    models' tensors together use about the shared budget. Pinned space (``pin``: needs
    CUDA) is registered with the driver whole (``cuda_transfers.pinned_empty``)
    and is resident: each model's tensor is ``capacity_bytes``.
    """
    block_bytes = math.prod(block_shape) * dtype.itemsize
    shape = (capacity_bytes // block_bytes, *block_shape)
    if not pin:
        return torch.empty(shape, dtype=dtype)
    from shunter.engine.exec.cuda_transfers import pinned_empty

    return pinned_empty(shape, dtype)


class KVTransfers(Transfers):
    """Copies between ``device_kv[m]`` and ``host_kv[m]``, model m's block arrays on the
    two tiers (same block shape and dtype).

    Besides ``submit``/``poll``: ``wait_swapped_in(ids)`` is called by the executor
    before a forward pass that reads those requests' KV, and must order that pass after
    their H2D copies; ``synchronize()`` blocks until every submitted copy completed.
    """

    def __init__(
        self, device_kv: Mapping[str, torch.Tensor], host_kv: Mapping[str, torch.Tensor]
    ) -> None:
        for model, kv in device_kv.items():
            if kv.shape[1:] != host_kv[model].shape[1:] or kv.dtype != host_kv[model].dtype:
                raise ValueError(f"model {model!r}: device and host blocks differ")
        self.device_kv = dict(device_kv)
        self.host_kv = dict(host_kv)

    def add_model(self, model: str, device_kv: torch.Tensor, host_kv: torch.Tensor) -> None:
        """Copy one more model's blocks from the next plan on."""
        if device_kv.shape[1:] != host_kv.shape[1:] or device_kv.dtype != host_kv.dtype:
            raise ValueError(f"model {model!r}: device and host blocks differ")
        self.device_kv[model] = device_kv
        self.host_kv[model] = host_kv

    def remove_model(self, model: str) -> None:
        """Forget a model none of whose copies is in flight."""
        del self.device_kv[model], self.host_kv[model]

    def wait_swapped_in(self, request_ids: Iterable[str]) -> None:
        """Copies that completed inside ``submit`` need no waiting: the default."""

    def synchronize(self) -> None:
        """Copies that completed inside ``submit`` need no waiting: the default."""


class BlockingTransfers(KVTransfers):
    """Copies each plan's D2H batch, then its H2D batch, before ``submit`` returns, so
    ``poll`` reports every step at once: the reference on CPU.

    D2H goes first, so a block the plan both frees by preemption and refills by a
    swap-in is read before it is overwritten. Per model and direction the blocks are
    gathered with one index operation into a staging tensor and written with one more.
    """

    def __init__(
        self, device_kv: Mapping[str, torch.Tensor], host_kv: Mapping[str, torch.Tensor]
    ) -> None:
        super().__init__(device_kv, host_kv)
        self._done: list[int] = []

    def submit(self, plan: StepPlan) -> None:
        for model in self.device_kv:
            copy_blocks(self.device_kv[model], self.host_kv[model], plan.d2h(model), to_host=True)
        for model, copies in plan.swap_in.items():
            copy_blocks(self.device_kv[model], self.host_kv[model], copies, to_host=False)
        self._done.append(plan.step)

    def poll(self, now: float) -> list[int]:
        done, self._done = self._done, []
        return done


def make_transfers(
    device_kv: Mapping[str, torch.Tensor], host_kv: Mapping[str, torch.Tensor]
) -> KVTransfers:
    """Overlapped two-stream copies when the KV lives on a CUDA device, else blocking ones."""
    devices = {kv.device for kv in device_kv.values()}
    if len(devices) > 1:
        raise ValueError(f"every model's KV must be on one device, got {sorted(map(str, devices))}")
    if devices and next(iter(devices)).type == "cuda":
        from shunter.engine.exec.cuda_transfers import CudaTransfers

        return CudaTransfers(device_kv, host_kv)
    return BlockingTransfers(device_kv, host_kv)


def copy_blocks(
    device_kv: torch.Tensor, host_kv: torch.Tensor, copies: BlockCopies, *, to_host: bool
) -> None:
    """One batched, synchronous copy of whole blocks between the tiers."""
    if not copies:
        return
    if to_host:
        copy_rows_on_this_thread(host_kv, copies.hosts, device_kv, copies.devices)
    else:
        copy_rows_on_this_thread(device_kv, copies.devices, host_kv, copies.hosts)
