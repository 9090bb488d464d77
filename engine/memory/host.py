"""Host swap space: pinned host memory holding KV blocks in the same block-first layout.

Capacity is in bytes and shared by all models; a host block id indexes the model's own
view of the swap space, like device block ids do for the arena.

It is also the prefix cache's second tier: a host copy of a full block may be
published under its hash (``memory/prefix.py``) and then outlives its request, cached,
until the space is needed.
"""

from __future__ import annotations

from shunter.engine.memory.prefix import BlockHash, PublishedBlocks


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
        self._num_cached: dict[str, int] = {}  # per model, beside the LRU (read each step)
        # Blocks are (model, id); a hash names its model (``chain_start``).
        self._published: PublishedBlocks[tuple[str, int]] = PublishedBlocks()
        self._cached = self._published.cached

    def register(self, model: str, block_bytes: int) -> None:
        self._block_bytes[model] = block_bytes
        self._recycled[model] = []
        self._next_id[model] = 0
        self._num_used[model] = 0
        self._num_cached[model] = 0

    def unregister(self, model: str) -> None:
        """Forget a model none of whose host blocks is used (ValueError otherwise)."""
        used = self._num_used[model]
        if used:
            raise ValueError(f"host swap space: {model!r} still uses {used} blocks")
        for key in [k for k in self._cached if k[0] == model]:
            self._evict(key)
        del self._block_bytes[model], self._recycled[model]
        del self._next_id[model], self._num_used[model], self._num_cached[model]

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
        if self._published.active:
            ids = self._unhold(model, ids)
        self._recycled[model].extend(ids)
        self._num_used[model] -= len(ids)
        self.used_bytes -= len(ids) * self._block_bytes[model]

    def _unhold(self, model: str, ids: list[int]) -> list[int]:
        """Drop holds of shared blocks and cache published ones; the ids left to free."""
        published, bb = self._published, self._block_bytes[model]
        left = []
        for i in ids:
            key = (model, i)
            if not published.drop(key):  # another holder keeps it
                continue
            if published.is_published(key):
                self._cached[key] = None
                self._num_cached[model] += 1
                self._num_used[model] -= 1
                self.used_bytes -= bb
            else:
                left.append(i)
        return left

    # -- prefix caching ---------------------------------------------------------------
    def num_cached(self, model: str) -> int:
        return self._num_cached[model]

    @property
    def cached_bytes(self) -> int:
        """Bytes of the cached blocks (free in every count, kept until needed)."""
        return sum(n * self._block_bytes[m] for m, n in self._num_cached.items())

    def publish(self, model: str, ids: list[int], hashes: list[BlockHash]) -> None:
        """Used blocks ``ids`` hold the full blocks of KV ``hashes`` names (a hash
        already published keeps its block)."""
        for i, h in zip(ids, hashes, strict=True):
            self._published.publish((model, i), h)

    def lookup(self, model: str, hashes: list[BlockHash]) -> list[int]:
        """The blocks holding the longest published prefix of ``hashes`` (hashes of
        ``model``'s chains)."""
        return [i for _, i in self._published.lookup(hashes)]

    def share(self, model: str, ids: list[int]) -> None:
        """One more holder of each of ``ids`` (from ``lookup``)."""
        bb = self._block_bytes[model]
        for i in ids:
            if self._published.hold((model, i)):  # it was cached: used again
                self._num_cached[model] -= 1
                self._num_used[model] += 1
                self.used_bytes += bb

    def num_holders(self, model: str, i: int) -> int:
        return self._published.num_holders((model, i))

    def _evict(self, key: tuple[str, int]) -> None:
        model, i = key
        self._published.forget(key)
        self._num_cached[model] -= 1
        self._recycled[model].append(i)

    def check_integrity(self, model: str, used: set[int]) -> None:
        """``used`` are the host block ids of ``model`` the caller holds."""
        recycled = set(self._recycled[model])
        if len(recycled) != len(self._recycled[model]) or recycled & used:
            raise AssertionError(f"host {model}: a block is free twice or free and used")
        cached = {i for m, i in self._cached if m == model}
        if cached & (recycled | used):
            raise AssertionError(f"host {model}: a cached block is also free or used")
        try:
            self._published.check({(model, i) for i in used}, lambda key: key[0] == model)
        except AssertionError as e:
            raise AssertionError(f"host {model}: {e}") from None
        if recycled | used | cached != set(range(self._next_id[model])):
            raise AssertionError(f"host {model}: free + used != ids handed out")
        if len(used) != self._num_used[model]:
            raise AssertionError(f"host {model}: counts {self._num_used[model]} used")
        total = sum(self._num_used[m] * b for m, b in self._block_bytes.items())
        if total != self.used_bytes or total + self.cached_bytes > self.capacity_bytes:
            raise AssertionError(f"host swap: {total} bytes used, counted {self.used_bytes}")
        if len(cached) != self._num_cached[model]:
            raise AssertionError(f"host {model}: {len(cached)} blocks cached, counted otherwise")
