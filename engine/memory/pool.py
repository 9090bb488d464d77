"""One model's device KV blocks: the arena seen as an array of that model's blocks.

Block ``b`` occupies bytes ``[b * block_bytes, (b + 1) * block_bytes)`` of the arena, so
a block id is an index into ``arena.view(-1, layers, 2, block_tokens, kv_heads,
head_dim)``. Blocks and pages need not divide each other: the pool claims pages in
*chunks* of ``lcm(block_bytes, page_bytes)`` bytes, aligned to their size, which hold a
whole number of both. A chunk's pages are a KV slab of this model while the pool holds it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from shunter.engine.memory.arena import FREE, Arena, PageOwner


class BlockPool:
    """Free and used device blocks of one model, claiming free arena chunks on demand.

    ``num_free`` counts blocks allocatable now: free blocks of held chunks plus those of
    fully free chunks the pool may claim. ``allocate`` hands out the lowest ids first so
    live blocks stay packed at the bottom and high chunks empty out for release.
    """

    def __init__(self, arena: Arena, model: str, block_bytes: int) -> None:
        chunk_bytes = math.lcm(block_bytes, arena.page_bytes)
        if chunk_bytes > arena.total_bytes:
            raise ValueError(
                f"model {model!r}: a chunk of {chunk_bytes} bytes (lcm of block and page "
                f"sizes) does not fit the {arena.total_bytes}-byte arena"
            )
        self.arena = arena
        self.model = model
        self.owner = PageOwner.kv(model)
        self.block_bytes = block_bytes
        self.pages_per_chunk = chunk_bytes // arena.page_bytes
        self.blocks_per_chunk = chunk_bytes // block_bytes
        self._free: list[int] = []  # min-heap of free block ids in held chunks
        self._num_used: dict[int, int] = {}  # held chunk -> blocks not free
        self._num_used_total = 0
        self._claimable: list[int] = []  # min-heap of fully free chunks
        self._seen_version = -1

    # -- counts ---------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._fresh_claimable()) * self.blocks_per_chunk

    @property
    def num_held(self) -> int:
        return len(self._num_used) * self.blocks_per_chunk

    @property
    def num_held_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self._num_used_total

    @property
    def num_total(self) -> int:
        """Blocks this model could hold now: held chunks plus claimable ones."""
        return self.num_held + len(self._fresh_claimable()) * self.blocks_per_chunk

    def chunk_of(self, block: int) -> int:
        return block // self.blocks_per_chunk

    def chunk_blocks(self, chunk: int) -> range:
        return range(chunk * self.blocks_per_chunk, (chunk + 1) * self.blocks_per_chunk)

    def chunk_pages(self, chunk: int) -> range:
        return range(chunk * self.pages_per_chunk, (chunk + 1) * self.pages_per_chunk)

    @property
    def held_chunks(self) -> list[int]:
        return sorted(self._num_used)

    def num_used_in(self, chunk: int) -> int:
        return self._num_used[chunk]

    # -- paired verbs -----------------------------------------------------------------
    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def allocate(self, n: int) -> list[int]:
        """``n`` free blocks, lowest ids first. Raises MemoryError if there are fewer."""
        while len(self._free) < n:
            claimable = self._fresh_claimable()
            if not claimable:
                raise MemoryError(f"model {self.model!r}: {n} blocks requested, too few free")
            self.claim(heapq.heappop(claimable))
        blocks = [heapq.heappop(self._free) for _ in range(n)]
        for b in blocks:
            self._num_used[b // self.blocks_per_chunk] += 1
        self._num_used_total += n
        return blocks

    def free(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            self._num_used[b // self.blocks_per_chunk] -= 1
            self._num_used_total -= 1
            heapq.heappush(self._free, b)

    # -- chunks and the arena ---------------------------------------------------------
    def claim(self, chunk: int) -> None:
        """Make a fully free chunk of the arena a KV slab of this model."""
        was_fresh = self._seen_version == self.arena.version
        self.arena.convert(self.chunk_pages(chunk), FREE, self.owner)
        if was_fresh:
            if chunk in self._claimable:
                self._claimable.remove(chunk)
                heapq.heapify(self._claimable)
            self._seen_version = self.arena.version
        self._num_used[chunk] = 0
        for b in self.chunk_blocks(chunk):
            heapq.heappush(self._free, b)

    def release(self, chunk: int) -> None:
        """Return a held chunk whose blocks are all free to the arena."""
        if self._num_used[chunk]:
            raise ValueError(f"chunk {chunk} of {self.model!r} still has used blocks")
        del self._num_used[chunk]
        self._free = [b for b in self._free if b // self.blocks_per_chunk != chunk]
        heapq.heapify(self._free)
        self.arena.convert(self.chunk_pages(chunk), self.owner, FREE)
        self._seen_version = -1

    def _fresh_claimable(self) -> list[int]:
        # Rescan only when someone else changed page ownership: our own claims keep the
        # cached heap exact.
        if self._seen_version != self.arena.version:
            num_chunks = self.arena.num_pages // self.pages_per_chunk
            self._claimable = [
                c
                for c in range(num_chunks)
                if self.arena.is_free_run(c * self.pages_per_chunk, self.pages_per_chunk)
            ]
            self._seen_version = self.arena.version
        return self._claimable

    def check_integrity(self, used: set[int]) -> None:
        """``used`` are the block ids that the caller holds (owned or awaiting a copy)."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError(f"{self.model}: a block is free twice")
        if free & used:
            raise AssertionError(f"{self.model}: blocks both free and used: {free & used}")
        held = {b for c in self._num_used for b in self.chunk_blocks(c)}
        if free | used != held:
            raise AssertionError(f"{self.model}: free + used != held blocks")
        if self._num_used_total != len(used):
            raise AssertionError(f"{self.model}: counts {self._num_used_total} used blocks")
        for c, n in self._num_used.items():
            if n != sum(1 for b in self.chunk_blocks(c) if b in used):
                raise AssertionError(f"{self.model}: chunk {c} counts {n} used blocks")
            for p in self.chunk_pages(c):
                if self.arena.owner(p) != self.owner:
                    raise AssertionError(f"{self.model}: page {p} of a held chunk is not KV")
