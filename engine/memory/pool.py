"""One model's device KV blocks: the arena seen as an array of that model's blocks.

Block ``b`` occupies bytes ``[b * block_bytes, (b + 1) * block_bytes)`` of the arena, so
a block id is an index into ``arena.view(-1, layers, 2, block_tokens, kv_heads,
head_dim)``. Blocks and pages need not divide each other: the pool claims pages in
*chunks* of ``lcm(block_bytes, page_bytes)`` bytes, aligned to their size, which hold a
whole number of both. A chunk's pages are a KV slab of this model while the pool holds it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Container
from itertools import chain, filterfalse

from shunter.engine.memory.arena import Arena, PageOwner
from shunter.engine.memory.prefix import BlockHash, PublishedBlocks


class BlockPool:
    """Free and used device blocks of one model, claiming free arena chunks on demand.

    ``num_free`` counts blocks allocatable now: free blocks of held chunks plus those of
    fully free chunks the pool may claim (at most ``claim_limit()`` chunks when a limit
    is set: KV floors and ceilings). The free list is a stack, so allocation and freeing
    are list slices; blocks of a newly claimed chunk go after those already free, lowest
    ids first.

    A *draining* chunk is on its way back to the arena: its free blocks are never
    allocated, blocks freed in it stay out of the free list, and it can be released once
    none of its blocks is used.

    Prefix caching (``publish``, ``lookup``, ``share``): a full block may be published
    under the hash of its KV (``memory/prefix.py``). Another request with that prefix
    shares it (a block has as many holders as tables hold it) and ``free`` drops one
    holder. A published block whose last holder frees it stays *cached*: free, and
    counted free everywhere (any model or remapping may take its memory), but kept apart
    from the free stack, so blocks never published (and chunks the pool may claim) go
    first and cached ones are evicted least recently freed first. Allocating, draining
    or giving back a cached block forgets its hash.
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
        self.chunk_bytes = chunk_bytes
        self.pages_per_chunk = chunk_bytes // arena.page_bytes
        self.blocks_per_chunk = chunk_bytes // block_bytes
        self.claim_limit: Callable[[], int] | None = None
        arena.track_chunks(self.pages_per_chunk)
        self._free: list[int] = []  # stack of free block ids in held, undrained chunks
        self._chunks: set[int] = set()  # held chunks
        self._draining: dict[int, list[int]] = {}  # draining chunk -> its free blocks
        # Prefix caching (empty unless the engine publishes blocks). Its cached blocks
        # are free but not in ``_free``.
        self._published: PublishedBlocks[int] = PublishedBlocks()
        self._cached = self._published.cached

    # -- counts ---------------------------------------------------------------------
    @property
    def num_claimable(self) -> int:
        """Chunks the pool may claim now."""
        free = self.arena.num_free_chunks(self.pages_per_chunk)
        return free if self.claim_limit is None else min(free, self.claim_limit())

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._cached) + self.num_claimable * self.blocks_per_chunk

    @property
    def num_held(self) -> int:
        return len(self._chunks) * self.blocks_per_chunk

    @property
    def num_held_free(self) -> int:
        """Free blocks of held chunks that may be allocated (draining ones excluded)."""
        return len(self._free) + len(self._cached)

    @property
    def num_used(self) -> int:
        """Blocks not free: owned by requests or awaiting a copy."""
        drained = sum(map(len, self._draining.values()))
        return self.num_held - len(self._free) - len(self._cached) - drained

    @property
    def num_total(self) -> int:
        """Blocks this model could hold now: held chunks not draining plus claimable
        ones."""
        held = len(self._chunks) - len(self._draining)
        return (held + self.num_claimable) * self.blocks_per_chunk

    def chunk_blocks(self, chunk: int) -> range:
        return range(chunk * self.blocks_per_chunk, (chunk + 1) * self.blocks_per_chunk)

    def chunk_pages(self, chunk: int) -> range:
        return range(chunk * self.pages_per_chunk, (chunk + 1) * self.pages_per_chunk)

    def chunks_over(self, pages: range) -> list[int]:
        """Held chunks with a page in ``pages``, lowest first."""
        first, last = pages.start // self.pages_per_chunk, (pages.stop - 1) // self.pages_per_chunk
        return [c for c in range(first, last + 1) if c in self._chunks]

    @property
    def held_chunks(self) -> list[int]:
        return sorted(self._chunks)

    def num_used_per_chunk(self) -> dict[int, int]:
        """Used blocks of every held chunk, in one pass over the free blocks."""
        bpc = self.blocks_per_chunk
        used = dict.fromkeys(self._chunks, bpc)
        for b in chain(self._free, self._cached):
            used[b // bpc] -= 1
        for c, drained in self._draining.items():
            used[c] = bpc - len(drained)
        return used

    def empty_chunks(self) -> list[int]:
        """Held chunks none of whose blocks is used, lowest first.

        Counts the free blocks per chunk rather than the used ones: a pass over the free
        blocks, not over every held chunk."""
        bpc = self.blocks_per_chunk
        if bpc == 1:  # block ids are chunk ids: every free block is an empty chunk
            empty = [*self._free, *self._cached]
        else:
            free_in = Counter(map(bpc.__rfloordiv__, chain(self._free, self._cached)))
            empty = [c for c, n in free_in.items() if n == bpc]
        empty += [c for c, drained in self._draining.items() if len(drained) == bpc]
        empty.sort()
        return empty

    def holds(self, chunk: int) -> bool:
        return chunk in self._chunks

    def drained_chunks(self) -> list[int]:
        """Draining chunks none of whose blocks is used any longer, lowest first."""
        bpc = self.blocks_per_chunk
        return sorted(c for c, drained in self._draining.items() if len(drained) == bpc)

    def is_draining(self, chunk: int) -> bool:
        return chunk in self._draining

    def num_used_in(self, chunk: int) -> int:
        bpc = self.blocks_per_chunk
        drained = self._draining.get(chunk)
        if drained is not None:
            return bpc - len(drained)
        return bpc - sum(1 for b in chain(self._free, self._cached) if b // bpc == chunk)

    # -- paired verbs -----------------------------------------------------------------
    def can_allocate(self, n: int) -> bool:
        # Held free blocks first: counting claimable chunks asks the arena.
        return n <= len(self._free) + len(self._cached) or n <= self.num_free

    def allocate(self, n: int, *, claim: bool = True) -> list[int]:
        """``n`` free blocks. Raises MemoryError if there are fewer. Without ``claim``
        only held blocks (``num_held_free``) are taken: cached ones are evicted rather
        than a chunk claimed (a compaction must not grow the pool it shrinks)."""
        free, cached = self._free, self._cached
        if claim and len(free) < n:
            num_chunks = -(-(n - len(free)) // self.blocks_per_chunk)
            if cached:  # what the arena does not give comes from evicting
                num_chunks = min(num_chunks, self.num_claimable)
            if num_chunks:
                self.claim(num_chunks)
        if n <= 0:
            return []
        if n > len(free) + len(cached):
            raise MemoryError(f"model {self.model!r}: too few free blocks")
        take = min(n, len(free))
        blocks = free[len(free) - take :]
        del free[len(free) - take :]
        blocks.reverse()
        while len(blocks) < n:
            blocks.append(self._published.evict_oldest())
        return blocks

    def free(self, blocks: list[int]) -> None:
        """Drop one holder of each of ``blocks``; those left without one become free."""
        if self._published.active:
            self._free_published(blocks)
            return
        if not self._draining:
            self._free.extend(blocks)
            return
        bpc = self.blocks_per_chunk
        for b in blocks:
            drained = self._draining.get(b // bpc)
            (self._free if drained is None else drained).append(b)

    def _free_published(self, blocks: list[int]) -> None:
        """``free`` while some blocks are published or shared."""
        published, draining, bpc = self._published, self._draining, self.blocks_per_chunk
        cached: list[int] = []
        for b in blocks:
            if not published.drop(b):  # another table still holds it
                continue
            drained = draining.get(b // bpc) if draining else None
            if drained is not None:
                published.forget(b)
                drained.append(b)
            elif published.is_published(b):
                cached.append(b)
            else:
                self._free.append(b)
        # Least recently freed go first, a request's tail blocks before its head.
        self._cached.update(dict.fromkeys(reversed(cached)))

    # -- prefix caching ---------------------------------------------------------------
    @property
    def num_cached(self) -> int:
        """Free blocks that still hold a published block's KV."""
        return len(self._cached)

    def num_in_use(self, blocks: list[int]) -> int:
        """How many of ``blocks`` (from ``lookup``) are used, not cached free."""
        cached = self._cached
        return sum(1 for b in blocks if b not in cached)

    def num_holders(self, block: int) -> int:
        """Tables holding a used block (1 unless it is shared)."""
        return self._published.num_holders(block)

    def publish(self, block: int, block_hash: BlockHash) -> None:
        """A used block now holds the full block of KV ``block_hash`` names; later
        requests with that prefix may share it. A hash already published keeps its
        block (this one stays private)."""
        self._published.publish(block, block_hash)

    def lookup(self, hashes: list[BlockHash]) -> list[int]:
        """The blocks holding the longest published prefix of ``hashes``, in order
        (none in a draining chunk: those are leaving)."""
        draining, bpc = self._draining, self.blocks_per_chunk
        found: list[int] = []
        for b in self._published.lookup(hashes):
            if draining and b // bpc in draining:
                break
            found.append(b)
        return found

    def share(self, blocks: list[int]) -> None:
        """One more holder of each of ``blocks`` (from ``lookup``): a cached one leaves
        the free blocks, a used one is shared."""
        for b in blocks:
            self._published.hold(b)

    def moved(self, src: int, dst: int) -> None:
        """A used block's KV and holders moved from ``src`` to ``dst`` (a relocation
        move): its hash and holders follow it; ``src`` is freed as a private block."""
        self._published.moved(src, dst)

    def _evict_in(self, chunks: Container[int]) -> list[int]:
        """Forget the cached blocks of ``chunks`` (drained or given back); return them."""
        bpc = self.blocks_per_chunk
        gone = [b for b in self._cached if b // bpc in chunks]
        for b in gone:
            self._published.forget(b)
        return gone

    # -- chunks and the arena ---------------------------------------------------------
    def claim(self, num_chunks: int) -> None:
        """Make the lowest ``num_chunks`` fully free chunks of the arena KV slabs of this
        model; their blocks go under those already free."""
        if num_chunks > self.num_claimable:
            raise MemoryError(f"model {self.model!r}: too few free blocks")
        chunks = self.arena.claim_chunks(self.pages_per_chunk, num_chunks, self.owner)
        self._chunks.update(chunks)
        # Lowest id on top: those go first.
        chunks.reverse()
        if self.blocks_per_chunk == 1:
            blocks = chunks
        else:
            blocks = [b for c in chunks for b in reversed(self.chunk_blocks(c))]
        self._free[:0] = blocks

    def release(self, chunk: int) -> None:
        """Return a held chunk whose blocks are all free to the arena."""
        if self.num_used_in(chunk):
            raise ValueError(f"chunk {chunk} of {self.model!r} still has used blocks")
        self._give_back([chunk])

    def release_empty(self, max_chunks: int | None = None) -> int:
        """Return held chunks none of whose blocks is used, at most ``max_chunks`` of
        them (every one without): draining ones first (nothing is allocated from them),
        then the highest. Returns the chunks returned."""
        chunks = self.empty_chunks()
        if max_chunks is not None and len(chunks) > max_chunks:
            if self._draining:
                chunks.sort(key=lambda c: (c in self._draining, c))
            chunks = chunks[len(chunks) - max(0, max_chunks) :]
        self._give_back(chunks)
        return len(chunks)

    def _give_back(self, chunks: list[int]) -> None:
        if not chunks:
            return
        if not self._chunks.issuperset(chunks):
            raise ValueError(f"{self.model!r} gives back chunks it does not hold")
        self.arena.release_chunks(self.pages_per_chunk, chunks, self.owner)
        gone = set(chunks)
        self._chunks -= gone
        draining = self._draining
        if draining:
            gone.difference_update([c for c in chunks if draining.pop(c, None) is not None])
        if gone:
            bpc = self.blocks_per_chunk
            if self._cached:
                self._evict_in(gone)
            if bpc == 1:  # block ids are chunk ids: the filter runs in C
                self._free = list(filterfalse(gone.__contains__, self._free))
            else:
                self._free = [b for b in self._free if b // bpc not in gone]

    def drain(self, chunk: int) -> None:
        """Stop allocating from a held chunk, so that it empties."""
        if chunk in self._draining:
            return
        if chunk not in self._chunks:
            raise ValueError(f"chunk {chunk} is not held by {self.model!r}")
        bpc = self.blocks_per_chunk
        drained = [b for b in self._free if b // bpc == chunk]
        if self._cached:
            drained += self._evict_in({chunk})
        self._draining[chunk] = drained
        self._free = [b for b in self._free if b // bpc != chunk]

    def undrain(self, chunk: int) -> None:
        """Allocate from a draining chunk again."""
        drained = self._draining.pop(chunk, None)
        if drained is not None:
            self._free[:0] = drained

    def check_integrity(self, used: set[int]) -> None:
        """``used`` are the block ids that the caller holds (owned or awaiting a copy)."""
        drained = [b for blocks in self._draining.values() for b in blocks]
        free = set(self._free) | set(self._cached) | set(drained)
        if len(free) != len(self._free) + len(self._cached) + len(drained):
            raise AssertionError(f"{self.model}: a block is free twice")
        if free & used:
            raise AssertionError(f"{self.model}: blocks both free and used: {free & used}")
        held = {b for c in self._chunks for b in self.chunk_blocks(c)}
        if free | used != held:
            raise AssertionError(f"{self.model}: free + used != held blocks")
        bpc = self.blocks_per_chunk
        if any(b // bpc in self._draining for b in chain(self._free, self._cached)):
            raise AssertionError(f"{self.model}: a draining chunk's block is allocatable")
        if any(self._published.is_published(b) for b in self._free):
            raise AssertionError(f"{self.model}: a published block is on the free stack")
        try:
            self._published.check(used)
        except AssertionError as e:
            raise AssertionError(f"{self.model}: {e}") from None
        for c in self._chunks:
            for p in self.chunk_pages(c):
                if self.arena.owner(p) != self.owner:
                    raise AssertionError(f"{self.model}: page {p} of a held chunk is not KV")
