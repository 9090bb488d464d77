"""Copies in flight: which steps' transfers are incomplete, and what waits on them.

A block touched by a copy (or a device-to-device move) of step s is *fenced* until the
transfer engine reports s complete: it is not freed, copied again or moved. Frees that
hit a fenced block are deferred to that step; D2H copies make their host copy valid
when they land. This is what keeps full-duplex copies race-free (DuplexKV).
"""

from __future__ import annotations

from shunter.engine.memory.table import NO_STEP, Block


class InFlight:
    """Fences per step. Steps complete in increasing order (the Transfers contract)."""

    def __init__(self) -> None:
        self._incomplete: set[int] = set()
        self._landing: dict[int, list[Block]] = {}
        self._device_frees: dict[int, list[tuple[str, int]]] = {}
        self._host_frees: dict[int, list[tuple[str, int]]] = {}

    def is_pending(self, step: int) -> bool:
        return step in self._incomplete

    def fenced(self, block: Block) -> bool:
        return block.xfer_step != NO_STEP and block.xfer_step in self._incomplete

    def fence(self, block: Block, step: int) -> None:
        block.xfer_step = step
        self._incomplete.add(step)

    def land(self, block: Block, step: int) -> None:
        """A D2H copy of ``block`` in ``step``: its host copy is valid once it lands."""
        self.fence(block, step)
        block.host_pending = True
        self._landing.setdefault(step, []).append(block)

    def defer_device(self, step: int, model: str, device: int) -> None:
        self._device_frees.setdefault(step, []).append((model, device))

    def defer_host(self, step: int, model: str, host: int) -> None:
        self._host_frees.setdefault(step, []).append((model, host))

    def complete(self, step: int) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """Lift the fences of ``step``; return its deferred (device, host) frees."""
        if step not in self._incomplete:
            return [], []
        self._incomplete.discard(step)
        for block in self._landing.pop(step, []):
            block.host_pending = False
            block.host_valid = True
        return self._device_frees.pop(step, []), self._host_frees.pop(step, [])

    def deferred(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """All deferred (device, host) frees, for integrity checks."""
        devices = [f for frees in self._device_frees.values() for f in frees]
        hosts = [f for frees in self._host_frees.values() for f in frees]
        return devices, hosts

    @property
    def num_pending_steps(self) -> int:
        return len(self._incomplete)
