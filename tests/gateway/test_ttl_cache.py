"""The gateway's read cache: shared misses, reads ahead, no stale overwrite, no cached
error, a bound on entries."""

from __future__ import annotations

import asyncio
import threading

import pytest

from shunter.gateway.ttl_cache import TtlCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_misses_share_one_read_and_an_entry_serves_until_its_bound() -> None:
    clock, loads = Clock(), []
    gate = threading.Event()

    def load() -> int:
        loads.append(clock.now)
        gate.wait(10)
        return len(loads)

    cache: TtlCache[str, int] = TtlCache(ttl_s=2.0, clock=clock)
    waiting = [asyncio.ensure_future(cache.get("k", load)) for _ in range(5)]
    await asyncio.sleep(0.05)
    gate.set()
    assert await asyncio.gather(*waiting) == [1] * 5
    clock.now += 0.5
    assert await cache.get("k", load) == 1 and len(loads) == 1
    clock.now += 1.6  # past the bound: waits for a new read
    assert await cache.get("k", load) == 2


async def test_an_entry_past_half_its_bound_is_read_again_behind_the_answer() -> None:
    clock, values = Clock(), iter([1, 2])
    cache: TtlCache[str, int] = TtlCache(ttl_s=2.0, clock=clock)
    assert await cache.get("k", lambda: next(values)) == 1
    clock.now += 1.2
    assert await cache.get("k", lambda: next(values)) == 1  # answered from the cache
    for _ in range(100):
        if not cache.reading():
            break
        await asyncio.sleep(0.01)
    assert cache.entry("k") == (1001.2, 2)


async def test_values_that_do_not_refresh_wait_for_their_bound() -> None:
    clock, loads = Clock(), []
    cache: TtlCache[str, int | None] = TtlCache(
        ttl_s=2.0, clock=clock, refreshes=lambda v: v is not None
    )
    assert await cache.get("guess", lambda: loads.append(1)) is None
    clock.now += 1.5
    assert await cache.get("guess", lambda: loads.append(1)) is None
    assert loads == [1] and not cache.reading()


async def test_a_failed_read_caches_nothing_and_an_older_read_never_replaces_a_newer() -> None:
    clock = Clock()
    cache: TtlCache[str, int] = TtlCache(ttl_s=2.0, clock=clock)

    def broken() -> int:
        raise RuntimeError("down")

    with pytest.raises(RuntimeError):
        await cache.get("k", broken)
    assert cache.entry("k") is None
    slow = threading.Event()

    def old_value() -> int:
        slow.wait(10)
        return 1

    older = cache.read("k", old_value, 1000.0)
    newer = cache.read("k", lambda: 2, 1001.0, after=1000.5)  # not the older one's read
    assert newer.result(10) == 2
    slow.set()
    assert older.result(10) == 1
    for _ in range(100):
        if not cache.reading():
            break
        await asyncio.sleep(0.01)
    assert cache.entry("k") == (1001.0, 2)


def test_the_oldest_entries_go_beyond_the_bound_on_entries() -> None:
    cache: TtlCache[int, int] = TtlCache(ttl_s=60.0, max_entries=2)
    for key in range(3):
        assert cache.get_blocking(key, lambda: key * 10) == key * 10  # noqa: B023 (called here)
    newest = cache.entry(2)
    assert cache.entry(0) is None and newest is not None and newest[1] == 20
    assert cache.get_blocking(1, lambda: -1) == 10  # still cached
