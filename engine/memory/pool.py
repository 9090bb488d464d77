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

from shunter.engine.memory.arena import FREE, Arena, PageOwner


class BlockPool:
    """Free and used device blocks of one model, claiming free arena chunks on demand.

    ``num_free`` counts blocks allocatable now: free blocks of held chunks plus those of
    fully free chunks the pool may claim. The free list is a stack, so allocation and
    freeing are list slices; blocks of a newly claimed chunk go after those already
    free, lowest ids first.
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
        self._free: list[int] = []  # stack of free block ids in held chunks
        self._chunks: set[int] = set()  # held chunks
        self._claimable: list[int] = []  # min-heap of fully free chunks
        self._seen_version = -1

    # -- counts ---------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._fresh_claimable()) * self.blocks_per_chunk

    @property
    def num_held(self) -> int:
        return len(self._chunks) * self.blocks_per_chunk

    @property
    def num_held_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Blocks not free: owned by requests or awaiting a copy."""
        return self.num_held - len(self._free)

    @property
    def num_total(self) -> int:
        """Blocks this model could hold now: held chunks plus claimable ones."""
        return self.num_held + len(self._fresh_claimable()) * self.blocks_per_chunk

    def chunk_blocks(self, chunk: int) -> range:
        return range(chunk * self.blocks_per_chunk, (chunk + 1) * self.blocks_per_chunk)

    def chunk_pages(self, chunk: int) -> range:
        return range(chunk * self.pages_per_chunk, (chunk + 1) * self.pages_per_chunk)

    @property
    def held_chunks(self) -> list[int]:
        return sorted(self._chunks)

    def num_used_in(self, chunk: int) -> int:
        bpc = self.blocks_per_chunk
        return bpc - sum(1 for b in self._free if b // bpc == chunk)

    # -- paired verbs -----------------------------------------------------------------
    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def allocate(self, n: int) -> list[int]:
        """``n`` free blocks. Raises MemoryError if there are fewer."""
        if len(self._free) < n:
            self.claim(-(-(n - len(self._free)) // self.blocks_per_chunk))
        if n <= 0:
            return []
        free = self._free
        blocks = free[-n:]
        del free[-n:]
        blocks.reverse()
        return blocks

    def allocate_outside(self, chunk: int, n: int) -> list[int]:
        """``n`` free blocks of held chunks other than ``chunk`` (to vacate it)."""
        bpc = self.blocks_per_chunk
        outside = [b for b in self._free if b // bpc != chunk]
        if len(outside) < n:
            raise MemoryError(f"model {self.model!r}: {n} blocks outside chunk {chunk}")
        taken = set(outside[-n:])
        self._free = [b for b in self._free if b not in taken]
        return outside[-n:]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(blocks)

    # -- chunks and the arena ---------------------------------------------------------
    def claim(self, num_chunks: int) -> None:
        """Make the lowest ``num_chunks`` fully free chunks of the arena KV slabs of this
        model."""
        claimable = self._fresh_claimable()
        if len(claimable) < num_chunks:
            raise MemoryError(f"model {self.model!r}: too few free blocks")
        chunks = [heapq.heappop(claimable) for _ in range(num_chunks)]
        pages = [p for c in chunks for p in self.chunk_pages(c)]
        self.arena.convert(pages, FREE, self.owner)
        self._seen_version = self.arena.version
        self._chunks.update(chunks)
        # Under the blocks already free, lowest id on top: those go first.
        self._free[:0] = [b for c in reversed(chunks) for b in reversed(self.chunk_blocks(c))]

    def release(self, chunk: int) -> None:
        """Return a held chunk whose blocks are all free to the arena."""
        if self.num_used_in(chunk):
            raise ValueError(f"chunk {chunk} of {self.model!r} still has used blocks")
        self._chunks.remove(chunk)
        bpc = self.blocks_per_chunk
        self._free = [b for b in self._free if b // bpc != chunk]
        self.arena.convert(self.chunk_pages(chunk), self.owner, FREE)
        self._seen_version = -1

    def _fresh_claimable(self) -> list[int]:
        # Rescan only when someone else changed page ownership: our own claims pop from
        # the cached heap and keep it exact.
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
        held = {b for c in self._chunks for b in self.chunk_blocks(c)}
        if free | used != held:
            raise AssertionError(f"{self.model}: free + used != held blocks")
        for c in self._chunks:
            for p in self.chunk_pages(c):
                if self.arena.owner(p) != self.owner:
                    raise AssertionError(f"{self.model}: page {p} of a held chunk is not KV")
