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
        # step -> (table, blocks copied up to, of those the full ones) landing then
        self._landing: dict[int, list[tuple[BlockTable, int, int]]] = {}
        self._device_frees: dict[int, Frees] = {}
        self._host_frees: dict[int, Frees] = {}

    def is_pending(self, step: int) -> bool:
        return step in self._incomplete

    def latest_pending(self, *steps: int) -> int | None:
        """The latest of ``steps`` whose copies are still in flight, if any."""
        incomplete, latest = self._incomplete, None
        for s in steps:
            if s in incomplete and (latest is None or s > latest):
                latest = s
        return latest

    def touch(self, step: int) -> None:
        """Step ``step`` carries a copy or a move: fence it until it completes."""
        self._incomplete.add(step)

    def count_swaps(self, step: int, model: str, num_blocks: int) -> None:
        """Step ``step`` carries ``num_blocks`` more blocks of ``model``'s swap copies
        (swap-ins and preemptions, not eager rotation): fence it, and count them until
        it completes."""
        self._incomplete.add(step)
        counts = self._swap_blocks.get(step)
        if counts is None:
            counts = self._swap_blocks[step] = {}
        counts[model] = counts.get(model, 0) + num_blocks

    def num_swap_blocks(self) -> dict[str, int]:
        """Blocks of swap copies in steps not complete yet, per model."""
        total: dict[str, int] = {}
        for counts in self._swap_blocks.values():
            for model, n in counts.items():
                total[model] = total.get(model, 0) + n
        return total

    def land(self, table: BlockTable, end: int, step: int) -> None:
        """D2H copies of ``step`` (of full blocks) make the table's host copies valid up
        to ``end``."""
        self._incomplete.add(step)
        landing = self._landing.get(step)
        if landing is None:
            landing = self._landing[step] = []
        landing.append((table, end, end))

    def copy_out(
        self, step: int, table: BlockTable, end: int, full: int, sources: list[int]
    ) -> None:
        """A preemption's D2H copies in ``step``: the table's ``sources`` device blocks,
        its blocks up to ``end`` (the first ``full`` of them full). They count as swap
        copies (``count_swaps``), make its host copies valid up to ``end`` when they
        land (``land``), and free ``sources`` then (``defer_device``). One call: LVF
        preempts many requests every step."""
        self._incomplete.add(step)
        landing = self._landing.get(step)
        if landing is None:
            landing = self._landing[step] = []
        landing.append((table, end, full))
        model = table.model
        counts = self._swap_blocks.get(step)
        if counts is None:
            counts = self._swap_blocks[step] = {}
        counts[model] = counts.get(model, 0) + len(sources)
        _defer(self._device_frees, step, model, sources)

    def defer_device(self, step: int, model: str, ids: list[int]) -> None:
        _defer(self._device_frees, step, model, ids)

    def defer_host(self, step: int, model: str, ids: list[int]) -> None:
        _defer(self._host_frees, step, model, ids)

    def complete(self, step: int) -> tuple[Frees, Frees, list[tuple[BlockTable, int]]]:
        """Lift the fences of ``step``; return its deferred (device, host) frees and
        the tables whose host copies landed, each with how many of its leading host
        blocks now hold landed copies of full blocks."""
        if step not in self._incomplete:
            return {}, {}, []
        self._incomplete.discard(step)
        self._swap_blocks.pop(step, None)
        landed = []
        for table, end, full in self._landing.pop(step, []):
            table.num_host_valid = max(table.num_host_valid, end)
            landed.append((table, min(full, table.num_host_valid)))
        return self._device_frees.pop(step, {}), self._host_frees.pop(step, {}), landed

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


def _defer(frees: dict[int, Frees], step: int, model: str, ids: list[int]) -> None:
    # Plain lookups, not setdefault: that would build two containers per call, and a
    # step defers frees for every preempted request.
    by_model = frees.get(step)
    if by_model is None:
        by_model = frees[step] = {}
    deferred = by_model.get(model)
    if deferred is None:
        by_model[model] = list(ids)
    else:
        deferred += ids
