"""The free room of a decision over several models, pool by pool (sched/room.py)."""

from __future__ import annotations

from shunter.engine.request import RequestState
from shunter.engine.sched.room import Room
from tests.engine.sched.helpers import Book

W = RequestState.WAITING


def test_the_ledger_shares_the_free_pages_and_the_spare_memory_among_the_pools() -> None:
    book = Book()
    a = book.add("a", W, model="a")
    b = book.add("b", W, model="b")
    room = Room(held={"a": 1, "b": 0}, claims={"a": 3, "b": 2}, shared_pages=3)
    ledger = room.ledger()
    assert (ledger.available("a"), ledger.available("b")) == (4, 2)
    ledger.take("a", 2)  # its own block, then one free page
    assert (ledger.available("a"), ledger.available("b")) == (2, 2)
    ledger.take("b", 2)
    assert (ledger.available("a"), ledger.available("b")) == (0, 0)
    assert not ledger.any_available()
    assert room.ledger().fits_all([a, b], [3, 1])
    assert not room.ledger().fits_all([a, b], [4, 1])  # the pages a needs, b needs too
    # b's floor keeps two of the five free pages for it: a claiming the rest leaves them.
    floors = Room(held={"a": 0, "b": 0}, claims={"a": 3, "b": 5}, kept={"b": 2}, shared_pages=3)
    kept = floors.ledger()
    assert (kept.available("a"), kept.available("b")) == (3, 5)
    kept.take("a", 3)
    assert (kept.available("a"), kept.available("b")) == (0, 2)
    # Two of b's three free blocks are beyond its floor: a may be given them.
    spare = Room(held={"a": 0, "b": 3}, spare={"b": 2}).ledger()
    assert (spare.available("a"), spare.available("b")) == (2, 3)
    spare.take("b", 2)  # its own block first, then a spare one
    assert (spare.available("a"), spare.available("b")) == (1, 1)
    assert Room.one(3).ledger().fits_all([a, b], [2, 1])  # one pool: a sum
