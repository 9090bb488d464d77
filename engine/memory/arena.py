"""The device arena: one allocation split into fixed pages, each with one owner.

A page is FREE, holds WEIGHTS of one layer of one model (``layer=None`` for the
embeddings, head and final norm), or is a KV slab of exactly one model. The arena only
keeps ownership; block pools and the weight placement build on it, and a remapping
controller converts runs of weight pages to KV and back with ``convert``.
"""

from __future__ import annotations

import enum
import heapq
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


class OwnerKind(enum.Enum):
    FREE = "free"
    WEIGHTS = "weights"
    KV = "kv"


@dataclass(frozen=True, slots=True)
class PageOwner:
    """Who a page belongs to. Compare with ``==``; instances are interchangeable."""

    kind: OwnerKind
    model: str | None = None
    layer: int | None = None

    @staticmethod
    def weights(model: str, layer: int | None) -> PageOwner:
        return PageOwner(OwnerKind.WEIGHTS, model, layer)

    @staticmethod
    def kv(model: str) -> PageOwner:
        return PageOwner(OwnerKind.KV, model)


FREE = PageOwner(OwnerKind.FREE)


class Arena:
    """Page ownership of the device arena.

    ``version`` changes whenever any page changes owner, so views derived from the
    ownership know when to look again. For each chunk size a block pool registers
    (``track_chunks``), the arena keeps count of the fully free aligned chunks, so a
    pool learns how much it may claim, and which chunks, without scanning pages.
    """

    def __init__(self, num_pages: int, page_bytes: int) -> None:
        if num_pages <= 0 or page_bytes <= 0:
            raise ValueError("an arena needs a positive page count and page size")
        self.num_pages = num_pages
        self.page_bytes = page_bytes
        self.version = 0
        self._owners: list[PageOwner] = [FREE] * num_pages
        self._num_free = num_pages
        # Per tracked chunk size: free pages per chunk, the number of fully free
        # chunks, and a min-heap of fully free chunks (entries go stale; checked on pop).
        self._free_in: dict[int, list[int]] = {}
        self._num_free_chunks: dict[int, int] = {}
        self._free_heap: dict[int, list[int]] = {}

    @property
    def num_free_pages(self) -> int:
        return self._num_free

    @property
    def total_bytes(self) -> int:
        return self.num_pages * self.page_bytes

    def owner(self, page: int) -> PageOwner:
        return self._owners[page]

    def pages_of(self, owner: PageOwner) -> list[int]:
        return [p for p, o in enumerate(self._owners) if o == owner]

    def counts(self) -> Counter[PageOwner]:
        """Pages per owner: the memory map in numbers."""
        return Counter(self._owners)

    def is_free_run(self, start: int, num_pages: int) -> bool:
        end = start + num_pages
        return end <= self.num_pages and all(o is FREE for o in self._owners[start:end])

    def convert(self, pages: Iterable[int], expect: PageOwner, new: PageOwner) -> None:
        """Give ``pages`` to ``new``; every page must belong to ``expect`` now.

        This one verb covers allocation (FREE -> X), release (X -> FREE) and handing
        a weight layer's pages to the KV cache and back (WEIGHTS <-> FREE <-> KV).
        Checks all pages before changing any.
        """
        pages = list(pages)
        if new == FREE:
            new = FREE  # one instance, so ``is FREE`` tells free pages apart
        if len(set(pages)) != len(pages):
            raise ValueError("convert: duplicate pages")
        owners = self._owners
        for p in pages:
            if not 0 <= p < self.num_pages:
                raise IndexError(f"page {p} outside the arena")
            o = owners[p]
            if o is not expect and o != expect:  # identity first: owners are shared
                raise ValueError(f"page {p} belongs to {o}, not {expect}")
        if expect == new:
            return
        for p in pages:
            self._owners[p] = new
        delta = int(new == FREE) - int(expect == FREE)
        self._num_free += len(pages) * delta
        self.version += 1
        if delta:
            for size in self._free_in:
                self._count_chunks(size, pages, delta)

    def track_chunks(self, pages_per_chunk: int) -> None:
        """Count fully free aligned chunks of ``pages_per_chunk`` pages from now on."""
        size = pages_per_chunk
        if size in self._free_in:
            return
        counts = [0] * (self.num_pages // size)
        for c in range(len(counts)):
            counts[c] = sum(o is FREE for o in self._owners[c * size : (c + 1) * size])
        self._free_in[size] = counts
        self._free_heap[size] = [c for c, n in enumerate(counts) if n == size]
        self._num_free_chunks[size] = len(self._free_heap[size])

    def num_free_chunks(self, pages_per_chunk: int) -> int:
        """Fully free aligned chunks of a tracked size."""
        return self._num_free_chunks[pages_per_chunk]

    def take_free_chunks(self, pages_per_chunk: int, n: int) -> list[int]:
        """The ``n`` lowest fully free chunks of a tracked size, for the caller to
        convert at once (ValueError if there are fewer)."""
        size = pages_per_chunk
        heap, counts = self._free_heap[size], self._free_in[size]
        if n > self._num_free_chunks[size]:
            raise ValueError(f"{n} free chunks of {size} pages wanted")
        chunks: list[int] = []
        while len(chunks) < n:
            c = heapq.heappop(heap)
            if counts[c] == size and (not chunks or c != chunks[-1]):  # not stale
                chunks.append(c)
        return chunks

    def _count_chunks(self, size: int, pages: list[int], delta: int) -> None:
        counts, heap = self._free_in[size], self._free_heap[size]
        for p in pages:
            c = p // size
            if c >= len(counts):
                continue
            counts[c] += delta
            if delta > 0 and counts[c] == size:
                self._num_free_chunks[size] += 1
                heapq.heappush(heap, c)
            elif delta < 0 and counts[c] == size - 1:
                self._num_free_chunks[size] -= 1

    def find_free_run(self, num_pages: int, *, from_top: bool = False) -> int | None:
        """First page of a run of ``num_pages`` free pages (lowest, or highest)."""
        starts = range(self.num_pages - num_pages + 1)
        for start in reversed(starts) if from_top else starts:
            if self.is_free_run(start, num_pages):
                return start
        return None

    def check_integrity(self) -> None:
        free_flags = [o is FREE for o in self._owners]
        free = sum(free_flags)
        if free != self._num_free:
            raise AssertionError(f"arena counts {self._num_free} free pages, holds {free}")
        for size, counts in self._free_in.items():
            chunks = zip(*[iter(free_flags[: len(counts) * size])] * size, strict=True)
            actual = list(map(sum, chunks))
            if actual != counts:
                raise AssertionError(f"free pages per chunk of {size} pages miscounted")
            if self._num_free_chunks[size] != counts.count(size):
                raise AssertionError(f"free chunks of {size} pages miscounted")
        for p, (o, free) in enumerate(zip(self._owners, free_flags, strict=True)):
            if free != (o.model is None):
                raise AssertionError(f"page {p}: malformed owner {o}")
