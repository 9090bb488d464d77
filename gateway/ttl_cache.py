"""Database reads the gateway keeps for a few seconds: keys' grants, the route table and
the rows a usage record points at.

An entry serves ``ttl_s`` seconds from the start of the read that made it, so a change
in the database is seen within that bound. Requests that miss share one read per key;
from ``REFRESH_AT`` of the bound on, an entry in use is read again in the background
while it keeps answering, so a busy key never waits for the database. A read that fails
caches nothing (its waiters get the error), and a read never replaces an entry made by
a read that started later. The oldest entries go beyond ``max_entries``.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from shunter.gateway.db import await_read, submit_db

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

REFRESH_AT = 0.5  # of the bound: an entry in use is read again from this age on
MAX_ENTRIES = 10_000


class TtlCache(Generic[K, V]):
    """Values by key, each read by a loader in the gateway's database threads (see the
    module docstring). ``clock`` gives monotonic seconds; ``refreshes`` says which
    values are read again ahead of their bound (the others wait for it)."""

    def __init__(
        self,
        *,
        ttl_s: float,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
        refreshes: Callable[[V], bool] = lambda value: True,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self.refreshes = refreshes
        self._lock = threading.Lock()
        # key -> (start of the read that made it, value), oldest first
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        # key -> (start, the read in flight shared by every request waiting for it)
        self._reads: dict[K, tuple[float, concurrent.futures.Future[V]]] = {}

    async def get(self, key: K, load: Callable[[], V]) -> V:
        """``key``'s value: the cached one within the bound (read again in the background
        from ``REFRESH_AT`` of it on), else the result of a read, which an unreachable
        database turns into the 503 ``database_unavailable``."""
        now = self.clock()
        hit = self.entry(key)
        if hit is not None and now - hit[0] < self.ttl_s:
            if now - hit[0] >= REFRESH_AT * self.ttl_s and self.refreshes(hit[1]):
                self.read(key, load, now)
            return hit[1]
        return await await_read(self.read(key, load, now))

    def get_blocking(self, key: K, load: Callable[[], V]) -> V:
        """``get`` on a database thread: a miss reads here, without sharing the read."""
        now = self.clock()
        hit = self.entry(key)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        value = load()
        self._store(key, now, value)
        return value

    def entry(self, key: K) -> tuple[float, V] | None:
        """``key``'s entry (the start of the read that made it, its value), however old."""
        with self._lock:
            return self._entries.get(key)

    def read(
        self, key: K, load: Callable[[], V], now: float, *, after: float = -float("inf")
    ) -> concurrent.futures.Future[V]:
        """The read of ``key`` in flight if it started at ``after`` or later, else a new
        one started at ``now``; its value is cached when it ends."""
        with self._lock:
            reading = self._reads.get(key)
            if reading is not None and reading[0] >= after:
                return reading[1]
            future = submit_db(load)
            self._reads[key] = (now, future)

        def done(future: concurrent.futures.Future[V]) -> None:
            with self._lock:
                if (current := self._reads.get(key)) is not None and current[1] is future:
                    del self._reads[key]
            if not future.cancelled() and future.exception() is None:
                self._store(key, now, future.result())

        future.add_done_callback(done)
        return future

    def reading(self) -> bool:
        """Whether a read is in flight."""
        with self._lock:
            return bool(self._reads)

    def forget(self) -> None:
        """Drop every entry (the next request of each key reads the database)."""
        with self._lock:
            self._entries.clear()

    def _store(self, key: K, started: float, value: V) -> None:
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None and cached[0] > started:
                return  # a read that started later made it
            self._entries[key] = (started, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
