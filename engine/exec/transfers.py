"""KV block copies between the device arena and host swap space, done at submit.

One batched copy per model and direction per step: the blocks are gathered with one
index operation into a staging tensor and written with one more, never one copy per
layer (whole blocks are contiguous in the block-first layout). The copies run
synchronously inside ``submit``, so ``poll`` reports every step at once: the reference
on CPU, and a correct but non-overlapped path on a GPU.
"""

from __future__ import annotations

import math

import torch

from shunter.engine.interfaces import Transfers
from shunter.engine.plan import BlockCopy, StepPlan


def host_swap_space(
    capacity_bytes: int, block_shape: tuple[int, ...], dtype: torch.dtype, *, pin: bool
) -> torch.Tensor:
    """A model's host swap tensor ``[num_blocks, *block_shape]``, zeroed.

    ``HostSwap`` numbers each model's host blocks from 0 under one byte budget shared
    by all models, so one model never holds more than ``capacity_bytes`` of them.
    """
    block_bytes = math.prod(block_shape) * dtype.itemsize
    return torch.zeros((capacity_bytes // block_bytes, *block_shape), dtype=dtype, pin_memory=pin)


class BlockingTransfers(Transfers):
    """Copies each plan's D2H batch, then its H2D batch, before ``submit`` returns.

    ``device_kv[m]`` and ``host_kv[m]`` are model m's block arrays on the two tiers
    (same block shape). D2H goes first, so a block the plan both frees by preemption
    and refills by a swap-in is read before it is overwritten.
    """

    def __init__(self, device_kv: dict[str, torch.Tensor], host_kv: dict[str, torch.Tensor]):
        for model, kv in device_kv.items():
            if kv.shape[1:] != host_kv[model].shape[1:] or kv.dtype != host_kv[model].dtype:
                raise ValueError(f"model {model!r}: device and host blocks differ")
        self.device_kv = device_kv
        self.host_kv = host_kv
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


def copy_blocks(
    device_kv: torch.Tensor, host_kv: torch.Tensor, copies: list[BlockCopy], *, to_host: bool
) -> None:
    """One batched copy of whole blocks between the tiers."""
    if not copies:
        return
    device_ids = torch.tensor([c.device_block for c in copies], device=device_kv.device)
    host_ids = torch.tensor([c.host_block for c in copies], device=host_kv.device)
    if to_host:
        host_kv[host_ids] = device_kv[device_ids].to(host_kv.device)
    else:
        device_kv[device_ids] = host_kv[host_ids].to(device_kv.device)
