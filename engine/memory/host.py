"""Host swap space: pinned host memory holding KV blocks in the same block-first layout.

Capacity is in bytes and shared by all models; a host block id indexes the model's own
view of the swap space, like device block ids do for the arena.

It is also the prefix cache's second tier: a host copy of a full block may be
published under its hash (``memory/prefix.py``) and then outlives its request, cached,
until the space is needed.
"""

from __future__ import annotations

from shunter.engine.memory.prefix import BlockHash


class HostSwap:
    """Host blocks per model under one byte budget; freed ids are reused first.

    Prefix caching, as in ``BlockPool``: ``publish`` names a used block's KV by its
    hash; ``lookup`` finds published blocks, ``share`` takes a hold of them and ``free``
    drops one. A published block left without a holder is *cached*: free in every count
    (``used_bytes`` leaves it out) but kept, until an allocation short of never-cached
    space evicts it, least recently freed first, of whichever model.
    """

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError("host swap capacity must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._block_bytes: dict[str, int] = {}
        self._recycled: dict[str, list[int]] = {}
        self._next_id: dict[str, int] = {}
        self._num_used: dict[str, int] = {}
        self.cached_bytes = 0
        self._cached: dict[tuple[str, int], None] = {}  # LRU, least recently freed first
        self._block_of: dict[tuple[str, BlockHash], int] = {}
        self._hash_of: dict[tuple[str, int], BlockHash] = {}
        self._extra_holders: dict[tuple[str, int], int] = {}

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
        for key in [k for k in self._cached if k[0] == model]:
            self._evict(key)
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
        need = n * self._block_bytes[model]
        cached = self._cached
        while cached and self.capacity_bytes - self.used_bytes - self.cached_bytes < need:
            self._evict(next(iter(cached)))
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
        """Drop one holder of each of ``ids``; those left without one become free
        (cached, when published)."""
        if self._hash_of or self._extra_holders:
            ids = self._unhold(model, ids)
        self._recycled[model].extend(ids)
        self._num_used[model] -= len(ids)
        self.used_bytes -= len(ids) * self._block_bytes[model]

    def _unhold(self, model: str, ids: list[int]) -> list[int]:
        """Drop holds of shared blocks and cache published ones; the ids left to free."""
        extra, hash_of, bb = self._extra_holders, self._hash_of, self._block_bytes[model]
        left = []
        for i in ids:
            key = (model, i)
            n = extra.get(key)
            if n is not None:
                if n == 1:
                    del extra[key]
                else:
                    extra[key] = n - 1
            elif key in hash_of:
                self._cached[key] = None
                self.cached_bytes += bb
                self._num_used[model] -= 1
                self.used_bytes -= bb
            else:
                left.append(i)
        return left

    # -- prefix caching ---------------------------------------------------------------
    def num_cached(self, model: str) -> int:
        return sum(1 for m, _ in self._cached if m == model)

    def publish(self, model: str, ids: list[int], hashes: list[BlockHash]) -> None:
        """Used blocks ``ids`` hold the full blocks of KV ``hashes`` names (a hash
        already published keeps its block)."""
        for i, h in zip(ids, hashes, strict=True):
            if (model, h) not in self._block_of and (model, i) not in self._hash_of:
                self._block_of[model, h] = i
                self._hash_of[model, i] = h

    def lookup(self, model: str, hashes: list[BlockHash]) -> list[int]:
        """The blocks holding the longest published prefix of ``hashes``."""
        found = []
        for h in hashes:
            i = self._block_of.get((model, h))
            if i is None:
                break
            found.append(i)
        return found

    def share(self, model: str, ids: list[int]) -> None:
        """One more holder of each of ``ids`` (from ``lookup``)."""
        bb = self._block_bytes[model]
        for i in ids:
            key = (model, i)
            if key in self._cached:
                del self._cached[key]
                self.cached_bytes -= bb
                self._num_used[model] += 1
                self.used_bytes += bb
            else:
                self._extra_holders[key] = self._extra_holders.get(key, 0) + 1

    def num_holders(self, model: str, i: int) -> int:
        return 1 + self._extra_holders.get((model, i), 0)

    def _evict(self, key: tuple[str, int]) -> None:
        model, i = key
        del self._cached[key]
        del self._block_of[model, self._hash_of.pop(key)]
        self.cached_bytes -= self._block_bytes[model]
        self._recycled[model].append(i)

    def check_integrity(self, model: str, used: set[int]) -> None:
        """``used`` are the host block ids of ``model`` the caller holds."""
        recycled = set(self._recycled[model])
        if len(recycled) != len(self._recycled[model]) or recycled & used:
            raise AssertionError(f"host {model}: a block is free twice or free and used")
        cached = {i for m, i in self._cached if m == model}
        if cached & (recycled | used):
            raise AssertionError(f"host {model}: a cached block is also free or used")
        if not {i for m, i in self._hash_of if m == model} <= cached | used:
            raise AssertionError(f"host {model}: a published block is not kept")
        if recycled | used | cached != set(range(self._next_id[model])):
            raise AssertionError(f"host {model}: free + used != ids handed out")
        if len(used) != self._num_used[model]:
            raise AssertionError(f"host {model}: counts {self._num_used[model]} used")
        total = sum(self._num_used[m] * b for m, b in self._block_bytes.items())
        if total != self.used_bytes or total + self.cached_bytes > self.capacity_bytes:
            raise AssertionError(f"host swap: {total} bytes used, counted {self.used_bytes}")
        kept = sum(self._block_bytes[m] for m, _ in self._cached)
        if kept != self.cached_bytes:
            raise AssertionError(f"host swap: {kept} bytes cached, counted {self.cached_bytes}")
