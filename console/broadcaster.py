"""The broadcaster: computes the console's numbers every second and sends what changed
to the websocket groups.

Design: an asyncio task of the web process, started by the first console websocket
that joins in that process and cancelled when the last one leaves, so nothing runs while
nobody watches. It works the same in both deployments:

- Embedded default (one ASGI process, in-memory channel layer, local-memory cache, eager
  Celery): the process's own task feeds its own consumers; no beat is needed.
- Production (several web processes, channels-redis, Redis cache, separate beat): every
  process with viewers runs the task, but only the holder of a short lease in the cache
  (``cache.add`` with a TTL, renewed each tick) computes and sends to the groups, which
  channels-redis delivers to the consumers of every process. A holder that dies loses
  the lease within ``LEASE_TTL_S``, and another process with viewers takes over. Two
  holders for one tick (a renewal racing an expiry) only repeat a delta, which is
  harmless: deltas set values (see ``deltas``).

A Celery beat task was the alternative; it would need the broker and beat even in the
embedded default, and would compute every second whether or not anyone is watching.
Engine state itself still comes from beat's node polls; the broadcaster only reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from weakref import WeakKeyDictionary

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.core.cache import cache

from shunter.console import selectors
from shunter.console.deltas import Snapshot, broadcast_messages, with_rates

log = logging.getLogger("shunter.console")

INTERVAL_S = 1.0
LEASE_KEY = "console:broadcaster"
LEASE_TTL_S = 5


def snapshot(prev: Snapshot | None = None) -> Snapshot:
    """The console's numbers now: the overview and every node's view, with transfer
    rates against ``prev``'s views of the same nodes."""
    before = prev["nodes"] if prev else {}
    nodes = {k: with_rates(before.get(k), v) for k, v in selectors.node_views().items()}
    return {"overview": selectors.overview(), "nodes": nodes}


class Broadcaster:
    """One per event loop (process). ``join`` when a consumer connects, ``leave`` when it
    disconnects; the task runs while there is at least one member."""

    def __init__(self, *, interval_s: float = INTERVAL_S, lease_ttl_s: int = LEASE_TTL_S):
        self.interval_s = interval_s
        self.lease_ttl_s = lease_ttl_s
        self.members = 0
        self.token = secrets.token_hex(8)
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def join(self) -> None:
        self.members += 1
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="console-broadcaster"
            )

    async def leave(self) -> None:
        self.members = max(0, self.members - 1)
        if self.members or self._task is None:
            return
        task, self._task = self._task, None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if await cache.aget(LEASE_KEY) == self.token:
            await cache.adelete(LEASE_KEY)

    async def hold_lease(self) -> bool:
        """Take the lease, or renew it when this broadcaster holds it."""
        if await cache.aadd(LEASE_KEY, self.token, timeout=self.lease_ttl_s):
            return True
        if await cache.aget(LEASE_KEY) == self.token:
            await cache.atouch(LEASE_KEY, timeout=self.lease_ttl_s)
            return True
        return False

    async def tick(self, prev: Snapshot | None) -> Snapshot:
        """Compute a snapshot and send its deltas against ``prev``; the snapshot."""
        cur: Snapshot = await database_sync_to_async(snapshot)(prev)
        layer = get_channel_layer()
        assert layer is not None, "CHANNEL_LAYERS has no default layer"
        for group, delta in broadcast_messages(prev, cur):
            await layer.group_send(group, {"type": "console.delta", "delta": delta})
        return cur

    async def _run(self) -> None:
        prev: Snapshot | None = None
        while True:
            try:
                prev = await self.tick(prev) if await self.hold_lease() else None
            except Exception:
                # A failed tick (database or Redis away for a moment) must not end the
                # broadcasting; the next tick starts from a full snapshot.
                log.exception("console broadcast failed")
                prev = None
            await asyncio.sleep(self.interval_s)


_broadcasters: WeakKeyDictionary[asyncio.AbstractEventLoop, Broadcaster] = WeakKeyDictionary()


def broadcaster() -> Broadcaster:
    """This event loop's broadcaster."""
    loop = asyncio.get_running_loop()
    found = _broadcasters.get(loop)
    if found is None:
        found = _broadcasters[loop] = Broadcaster()
    return found
