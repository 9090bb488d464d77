"""Host swap space: pinned host memory holding KV blocks in the same block-first layout.

Capacity is in bytes and shared by all models; a host block id indexes the model's own
view of the swap space, like device block ids do for the arena.
"""

from __future__ import annotations


class HostSwap:
    """Host blocks per model under one byte budget; freed ids are reused first."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError("host swap capacity must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._block_bytes: dict[str, int] = {}
        self._recycled: dict[str, list[int]] = {}
        self._next_id: dict[str, int] = {}
        self._num_used: dict[str, int] = {}

    def register(self, model: str, block_bytes: int) -> None:
        self._block_bytes[model] = block_bytes
        self._recycled[model] = []
        self._next_id[model] = 0
        self._num_used[model] = 0

    def unregister(self, model: str) -> None:
        """Forget a model none of whose host blocks is used (ValueError otherwise)."""
        used = self._num_used[model]
        if used:
            raise ValueError(f"host swap space: {model!r} still uses {used} blocks")
        del self._block_bytes[model], self._recycled[model]
        del self._next_id[model], self._num_used[model]

    def num_used(self, model: str) -> int:
        return self._num_used[model]

    def num_free(self, model: str) -> int:
        return (self.capacity_bytes - self.used_bytes) // self._block_bytes[model]

    def can_allocate(self, model: str, n: int) -> bool:
        return n <= self.num_free(model)

    def allocate(self, model: str, n: int) -> list[int]:
        if not self.can_allocate(model, n):
            raise MemoryError(f"host swap space: {n} blocks of {model!r} do not fit")
        recycled = self._recycled[model]
        ids = recycled[-n:] if n else []
        del recycled[len(recycled) - len(ids) :]
        fresh = n - len(ids)
        if fresh:
            start = self._next_id[model]
            ids.extend(range(start, start + fresh))
            self._next_id[model] = start + fresh
        self._num_used[model] += n
        self.used_bytes += n * self._block_bytes[model]
        return ids

    def free(self, model: str, ids: list[int]) -> None:
        self._recycled[model].extend(ids)
        self._num_used[model] -= len(ids)
        self.used_bytes -= len(ids) * self._block_bytes[model]

    def check_integrity(self, model: str, used: set[int]) -> None:
        """``used`` are the host block ids of ``model`` the caller holds."""
        recycled = set(self._recycled[model])
        if len(recycled) != len(self._recycled[model]) or recycled & used:
            raise AssertionError(f"host {model}: a block is free twice or free and used")
        if recycled | used != set(range(self._next_id[model])):
            raise AssertionError(f"host {model}: free + used != ids handed out")
        if len(used) != self._num_used[model]:
            raise AssertionError(f"host {model}: counts {self._num_used[model]} used")
        total = sum(self._num_used[m] * b for m, b in self._block_bytes.items())
        if total != self.used_bytes or total > self.capacity_bytes:
            raise AssertionError(f"host swap: {total} bytes used, counted {self.used_bytes}")
