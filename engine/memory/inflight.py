"""Copies in flight: which steps' transfers are incomplete, and what waits on them.

A block touched by a copy (or a device-to-device move) of step s is *fenced* until the
transfer engine reports s complete: it is not freed, and so not reused as a copy
destination. Frees that hit fenced blocks are deferred to that step; D2H copies make
their host copies valid when they land. This keeps full-duplex copies race-free.
"""

from __future__ import annotations

from shunter.engine.memory.table import BlockTable

Frees = dict[str, list[int]]  # model -> block ids


class InFlight:
    """Fences per step. Steps complete in increasing order (the Transfers contract)."""

    def __init__(self) -> None:
        self._incomplete: set[int] = set()
        self._swap_blocks: dict[int, dict[str, int]] = {}  # step -> model -> swap blocks
        self._landing: dict[int, list[tuple[BlockTable, int]]] = {}
        self._device_frees: dict[int, Frees] = {}
        self._host_frees: dict[int, Frees] = {}

    def is_pending(self, step: int) -> bool:
        return step in self._incomplete

    def touch(self, step: int) -> None:
        """Step ``step`` carries a copy or a move: fence it until it completes."""
        self._incomplete.add(step)

    def count_swaps(self, step: int, model: str, num_blocks: int) -> None:
        """Step ``step`` carries ``num_blocks`` more blocks of ``model``'s swap copies
        (swap-ins and preemptions, not eager rotation): fence it, and count them until
        it completes."""
        self._incomplete.add(step)
        counts = self._swap_blocks.setdefault(step, {})
        counts[model] = counts.get(model, 0) + num_blocks

    def num_swap_blocks(self) -> dict[str, int]:
        """Blocks of swap copies in steps not complete yet, per model."""
        total: dict[str, int] = {}
        for counts in self._swap_blocks.values():
            for model, n in counts.items():
                total[model] = total.get(model, 0) + n
        return total

    def land(self, table: BlockTable, end: int, step: int) -> None:
        """D2H copies of ``step`` make the table's host copies valid up to ``end``."""
        self._incomplete.add(step)
        self._landing.setdefault(step, []).append((table, end))

    def defer_device(self, step: int, model: str, ids: list[int]) -> None:
        self._device_frees.setdefault(step, {}).setdefault(model, []).extend(ids)

    def defer_host(self, step: int, model: str, ids: list[int]) -> None:
        self._host_frees.setdefault(step, {}).setdefault(model, []).extend(ids)

    def complete(self, step: int) -> tuple[Frees, Frees]:
        """Lift the fences of ``step``; return its deferred (device, host) frees."""
        if step not in self._incomplete:
            return {}, {}
        self._incomplete.discard(step)
        self._swap_blocks.pop(step, None)
        for table, end in self._landing.pop(step, []):
            table.num_host_valid = max(table.num_host_valid, end)
        return self._device_frees.pop(step, {}), self._host_frees.pop(step, {})

    def num_deferred_devices(self, model: str) -> int:
        return sum(len(frees.get(model, ())) for frees in self._device_frees.values())

    def deferred(self) -> tuple[Frees, Frees]:
        """All deferred (device, host) frees per model, for integrity checks."""
        devices: Frees = {}
        hosts: Frees = {}
        for frees in self._device_frees.values():
            for model, ids in frees.items():
                devices.setdefault(model, []).extend(ids)
        for frees in self._host_frees.values():
            for model, ids in frees.items():
                hosts.setdefault(model, []).extend(ids)
        return devices, hosts

    @property
    def num_pending_steps(self) -> int:
        return len(self._incomplete)
