"""Free device memory pool by pool, for a decision over several models (LVF's).

Each model's blocks come from its own pool: the free blocks a pool holds serve only its
model's requests, and the arena's free pages serve whichever model claims them first,
each model up to what it may claim (its ceiling, the others' floors; ``KvBounds``).
A model holding memory beyond its floor can give it to another: at the step's end the
model that ran short is given chunks (``Capacity.reclaim``), and its request fits a step
later. So a pool's room for a request is its own free blocks, the free pages it may
claim and the other pools' free memory beyond their floors (``spare``), and preempting a
request makes room for its own pool, or for any pool if its model is beyond its floor.

Counted as one sum, free memory let LVF admit requests whose own pool was full and could
get nothing from the others (every pool within its floor): their model's admissions
stopped at the first (``Admission.fill``), and the free blocks of another model, whose
candidates the sum had already spent, went unused that step.

Pure logic: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shunter.engine.request import Request

# The pool of every request when the room is one sum (a single model's decision).
ONE_POOL = ""


def one_sum(held: Mapping[str, int], claims: Mapping[str, int]) -> int:
    """Free memory counted as one sum: every pool's held free units and the largest
    claim one of them could make (the claims share the free pages)."""
    return sum(held.values()) + max(claims.values(), default=0)


@dataclass(frozen=True)
class Room:
    """Free memory at the start of a decision, in the decision's units (blocks for one
    model, bytes across models).

    ``held``: the free units each executing model's pool holds; ``claims``: the units of
    the free pages each may claim now (its ceiling and the others' floors allowing);
    ``kept``: the free pages each one's floor keeps for it alone (the part of its floor it
    does not hold), and ``shared_pages`` the free pages no floor keeps, which the claims
    draw on once a model's own are spent; ``spare``: the part of ``held`` beyond the
    model's floor, which any pool may be given; ``movable``: the models beyond their
    floor, whose preempted requests make room for any pool. ``by_model`` False: one pool
    for every request (``one``).
    """

    held: Mapping[str, int]
    claims: Mapping[str, int] = field(default_factory=dict)
    kept: Mapping[str, int] = field(default_factory=dict)
    shared_pages: int = 0
    spare: Mapping[str, int] = field(default_factory=dict)
    movable: frozenset[str] = frozenset()
    by_model: bool = True

    @classmethod
    def one(cls, free: int) -> Room:
        """Every request in one pool of ``free`` units."""
        return cls(held={ONE_POOL: free}, by_model=False)

    @property
    def total(self) -> int:
        """The room as one sum (``one_sum``): what policies without pools count."""
        return one_sum(self.held, self.claims)

    def pool(self, r: Request) -> str:
        return r.model if self.by_model else ONE_POOL

    def helps(self, victim_pool: str, pool: str) -> bool:
        """Whether preempting a request of ``victim_pool`` makes room for ``pool``."""
        return victim_pool == pool or victim_pool in self.movable

    def ledger(self) -> Ledger:
        return Ledger(self)


class Ledger:
    """What is left of a ``Room`` as a decision hands it out."""

    def __init__(self, room: Room) -> None:
        self.room = room
        self._own = {p: n - room.spare.get(p, 0) for p, n in room.held.items()}
        self._spare = sum(room.spare.values())
        self._kept = dict(room.kept)
        self._shared = room.shared_pages
        self._claimed: dict[str, int] = {}

    def available(self, pool: str) -> int:
        """Units a request of ``pool`` may take: its pool's own free ones, the spare ones
        of every pool, and its claim on the free pages: those its floor keeps, then
        those no floor keeps that others have not claimed."""
        return self._own.get(pool, 0) + self._spare + self._claim(pool)

    def take(self, pool: str, units: int) -> None:
        """Hand out ``units`` (at most ``available(pool)``): the pool's own first, then
        the spare, then the free pages its floor keeps, then the shared ones."""
        own = min(units, self._own.get(pool, 0))
        self._own[pool] = self._own.get(pool, 0) - own
        spare = min(units - own, self._spare)
        self._spare -= spare
        pages = units - own - spare
        if pages:
            kept = min(pages, self._kept.get(pool, 0))
            self._kept[pool] = self._kept.get(pool, 0) - kept
            self._shared -= pages - kept
            self._claimed[pool] = self._claimed.get(pool, 0) + pages

    def _claim(self, pool: str) -> int:
        limit = self.room.claims.get(pool, 0) - self._claimed.get(pool, 0)
        return max(0, min(limit, self._kept.get(pool, 0) + self._shared))

    def any_available(self) -> bool:
        return any(self.available(p) > 0 for p in self.room.held)

    def fits_all(self, requests: Sequence[Request], costs: Sequence[int]) -> bool:
        """Whether every request fits (taking them all): the contention check."""
        need: dict[str, int] = {}
        for r, cost in zip(requests, costs, strict=True):
            pool = self.room.pool(r)
            need[pool] = need.get(pool, 0) + cost
        for pool, units in need.items():
            if units > self.available(pool):
                return False
            self.take(pool, units)
        return True
