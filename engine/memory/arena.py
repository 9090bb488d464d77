"""The device arena: one allocation split into fixed pages, each with one owner.

A page is FREE, holds WEIGHTS of one layer of one model (``layer=None`` for the
embeddings, head and final norm), or is a KV slab of exactly one model. The arena only
keeps ownership; block pools and the weight placement build on it, and a remapping
controller converts runs of weight pages to KV and back with ``convert``.
"""

from __future__ import annotations

import enum
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat
from operator import is_
from typing import TypeVar

_T = TypeVar("_T")


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
    (``track_chunks``), the arena keeps the sorted ids of the fully free aligned
    chunks, so a pool learns how much it may claim, and which chunks, without scanning
    pages; ``claim_chunks`` and ``release_chunks`` move whole chunks with list slices
    and merges, since pools trade capacity by the chunk every step.
    """

    def __init__(self, num_pages: int, page_bytes: int) -> None:
        if num_pages <= 0 or page_bytes <= 0:
            raise ValueError("an arena needs a positive page count and page size")
        self.num_pages = num_pages
        self.page_bytes = page_bytes
        self.version = 0
        self._owners: list[PageOwner] = [FREE] * num_pages
        self._num_free = num_pages
        # Pages per owner, kept as pages change hands (``counts`` is read every snapshot).
        self._counts: Counter[PageOwner] = Counter({FREE: num_pages})
        # Per tracked chunk size, the fully free chunks in increasing order (claims take
        # the lowest: a slice).
        self._free_chunks: dict[int, list[int]] = {}

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
        """Pages per owner: the memory map in numbers (owners with pages only)."""
        return +self._counts

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
            owners[p] = new
        self._moved(len(pages), expect, new)
        self._changed(pages, int(new == FREE) - int(expect == FREE))

    def track_chunks(self, pages_per_chunk: int) -> None:
        """Count fully free aligned chunks of ``pages_per_chunk`` pages from now on."""
        size = pages_per_chunk
        if size not in self._free_chunks:
            self._free_chunks[size] = self._whole_free_chunks(size)

    def num_free_chunks(self, pages_per_chunk: int) -> int:
        """Fully free aligned chunks of a tracked size."""
        return len(self._free_chunks[pages_per_chunk])

    def claim_chunks(self, pages_per_chunk: int, n: int, owner: PageOwner) -> list[int]:
        """Give the ``n`` lowest fully free chunks of a tracked size to ``owner``; return
        them in increasing order (ValueError if there are fewer)."""
        size, free = pages_per_chunk, self._free_chunks[pages_per_chunk]
        if not 0 <= n <= len(free):
            raise ValueError(f"{n} free chunks of {size} pages wanted, {len(free)} free")
        chunks = free[:n]
        del free[:n]
        pages = _chunk_pages(size, chunks)
        _assign(self._owners, pages, owner)
        self._moved(len(pages), FREE, owner)
        self._changed(pages, -1, chunks_of=(size, chunks))
        return chunks

    def release_chunks(self, pages_per_chunk: int, chunks: list[int], owner: PageOwner) -> None:
        """Return whole chunks of a tracked size that ``owner`` holds to the free pages.
        Checks every page before changing any."""
        size = pages_per_chunk
        pages = _chunk_pages(size, chunks)
        owners = self._owners
        # All in C on the common path: every page is this very owner instance.
        if not all(map(is_, map(owners.__getitem__, pages), repeat(owner))):
            self.convert(pages, owner, FREE)  # equal owners, or the error it raises
            return
        if len(set(chunks)) != len(chunks):
            raise ValueError("release_chunks: duplicate chunks")
        _assign(owners, pages, FREE)
        self._moved(len(pages), owner, FREE)
        free = self._free_chunks[size]
        free += chunks
        free.sort()  # two sorted runs (or a few): merged in linear time
        self._changed(pages, 1, chunks_of=(size, chunks))

    def _moved(self, num_pages: int, old: PageOwner, new: PageOwner) -> None:
        self._counts[old] -= num_pages
        self._counts[new] += num_pages

    def _changed(
        self, pages: list[int], delta: int, *, chunks_of: tuple[int, list[int]] | None = None
    ) -> None:
        """Pages changed owner, ``delta`` = +1 when they became free, -1 when they were
        free and no longer are, 0 otherwise: update the counts. ``chunks_of`` says the
        pages are whole chunks of one tracked size, whose list of free chunks the caller
        updated."""
        self.version += 1
        if not delta:
            return
        self._num_free += len(pages) * delta
        for size, free in self._free_chunks.items():
            if chunks_of is None or chunks_of[0] != size:
                self._refile(size, free, {p // size for p in pages})

    def _refile(self, size: int, free: list[int], chunks: set[int]) -> None:
        """Add to ``free`` (sorted) those of ``chunks`` now fully free, and drop the others."""
        owners = self._owners
        for c in sorted(chunks):
            if (c + 1) * size > self.num_pages:
                continue  # the partial chunk at the end is never claimed
            whole = all(o is FREE for o in owners[c * size : (c + 1) * size])
            i = bisect_left(free, c)
            listed = i < len(free) and free[i] == c
            if whole and not listed:
                free.insert(i, c)
            elif listed and not whole:
                del free[i]

    def _whole_free_chunks(self, size: int) -> list[int]:
        """Every fully free aligned chunk of ``size`` pages, by scanning the pages."""
        free_flags = [o is FREE for o in self._owners[: self.num_pages // size * size]]
        chunks = zip(*[iter(free_flags)] * size, strict=True)
        return [c for c, flags in enumerate(chunks) if all(flags)]

    def copy(self) -> Arena:
        """An independent copy of the ownership (chunk tracking included), for trying a
        placement without changing this arena."""
        other = Arena(self.num_pages, self.page_bytes)
        other.version = self.version
        other._owners = self._owners.copy()
        other._num_free = self._num_free
        other._counts = self._counts.copy()
        other._free_chunks = {size: free.copy() for size, free in self._free_chunks.items()}
        return other

    def find_free_run(self, num_pages: int, *, from_top: bool = False) -> int | None:
        """First page of a run of ``num_pages`` free pages (lowest, or highest).

        One pass counting consecutive free pages (placing a model's weights asks once
        per layer, over arenas of tens of thousands of pages)."""
        owners, n = self._owners, self.num_pages
        if num_pages <= 0:
            return n if from_top else 0
        run = 0
        if from_top:
            # Downwards, the first run to reach the length is the highest: it starts here.
            for p in range(n - 1, -1, -1):
                run = run + 1 if owners[p] is FREE else 0
                if run == num_pages:
                    return p
        else:
            for p, owner in enumerate(owners):
                run = run + 1 if owner is FREE else 0
                if run == num_pages:
                    return p - num_pages + 1
        return None

    def check_integrity(self) -> None:
        free_flags = [o is FREE for o in self._owners]
        free = sum(free_flags)
        if free != self._num_free:
            raise AssertionError(f"arena counts {self._num_free} free pages, holds {free}")
        if +self._counts != Counter(self._owners):
            raise AssertionError("arena's pages per owner miscounted")
        for size, chunks in self._free_chunks.items():
            if chunks != self._whole_free_chunks(size):
                raise AssertionError(f"free chunks of {size} pages misfiled")
        for p, (o, free) in enumerate(zip(self._owners, free_flags, strict=True)):
            if free != (o.model is None):
                raise AssertionError(f"page {p}: malformed owner {o}")


def _chunk_pages(size: int, chunks: list[int]) -> list[int]:
    """The pages of aligned chunks of ``size`` pages."""
    return chunks if size == 1 else [p for c in chunks for p in range(c * size, (c + 1) * size)]


def _assign(items: list[_T], indices: list[int], value: _T) -> None:
    """``items[i] = value`` for every ``i`` in ``indices``, looped in C (a zero-length
    deque drains the map): pools move hundreds of chunks a step."""
    deque(map(items.__setitem__, indices, repeat(value)), maxlen=0)
