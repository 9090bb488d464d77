"""The device arena: one allocation split into fixed pages, each with one owner.

A page is FREE, holds WEIGHTS of one layer of one model (``layer=None`` for the
embeddings, head and final norm), or is a KV slab of exactly one model. The arena only
keeps ownership; block pools and the weight placement build on it, and a remapping
controller converts runs of weight pages to KV and back with ``convert``.
"""

from __future__ import annotations

import enum
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
    ownership (a pool's claimable chunks) know when to look again.
    """

    def __init__(self, num_pages: int, page_bytes: int) -> None:
        if num_pages <= 0 or page_bytes <= 0:
            raise ValueError("an arena needs a positive page count and page size")
        self.num_pages = num_pages
        self.page_bytes = page_bytes
        self.version = 0
        self._owners: list[PageOwner] = [FREE] * num_pages
        self._num_free = num_pages

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
        if len(set(pages)) != len(pages):
            raise ValueError("convert: duplicate pages")
        for p in pages:
            if not 0 <= p < self.num_pages:
                raise IndexError(f"page {p} outside the arena")
            if self._owners[p] != expect:
                raise ValueError(f"page {p} belongs to {self._owners[p]}, not {expect}")
        if expect == new:
            return
        for p in pages:
            self._owners[p] = new
        self._num_free += len(pages) * (int(new == FREE) - int(expect == FREE))
        self.version += 1

    def find_free_run(self, num_pages: int, *, from_top: bool = False) -> int | None:
        """First page of a run of ``num_pages`` free pages (lowest, or highest)."""
        starts = range(self.num_pages - num_pages + 1)
        for start in reversed(starts) if from_top else starts:
            if self.is_free_run(start, num_pages):
                return start
        return None

    def check_integrity(self) -> None:
        free = sum(1 for o in self._owners if o == FREE)
        if free != self._num_free:
            raise AssertionError(f"arena counts {self._num_free} free pages, holds {free}")
        for p, o in enumerate(self._owners):
            if (o.kind is OwnerKind.FREE) != (o.model is None):
                raise AssertionError(f"page {p}: malformed owner {o}")
