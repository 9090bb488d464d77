"""One beat at a time: a second ``shunter beat`` idles while the first holds a lock.

Beat fires every periodic task it reads from the database, so two beats started by
mistake (or by an orchestrator that overlaps a restart) fire each one twice: twice the
node polls, twice every scheduled benchmark. ``LeaderScheduler`` is django-celery-beat's
``DatabaseScheduler`` behind a lease in Redis (``BeatLock``): on every tick the beat
that holds the lease renews it and runs; any other logs once that it idles and checks
again after ``IDLE_S``. A beat that stops releases the lease; one that dies loses it
when the lease expires (``SHUNTER_BEAT_LOCK_TTL_S``, 30 s by default), and the next
idle beat takes over. Without Redis (the embedded default, whose tasks run
in-process and which runs no beat) there is no lock.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from typing import Any

import redis
from django.conf import settings
from django_celery_beat.schedulers import DatabaseScheduler

log = logging.getLogger("shunter.beat")

LOCK_KEY = "shunter:beat:leader"
DEFAULT_TTL_S = 30.0
# How often an idle beat asks for the lease again.
IDLE_S = 5.0

# A released lease is a tombstone, "released:<owner>", for one lease time: free for any
# other owner, but not for the one that released it. A beat stopped by SIGTERM releases
# from the signal handler while its last renewal may still be on its way to Redis (sent
# on another connection, processed after the release); the tombstone keeps that late
# renewal from taking the lease back for a beat that is gone.
RELEASED = "released:"
# Set the lease if nobody holds it, or renew it if we do; 1 when we hold it after.
_HOLD = """
local holder = redis.call('GET', KEYS[1])
local ours = holder == ARGV[1]
local free = holder == false
    or (string.sub(holder, 1, 9) == 'released:' and holder ~= 'released:' .. ARGV[1])
if ours or free then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return 1
end
return 0
"""
# Give the lease up (leaving the tombstone) only if we hold it.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('SET', KEYS[1], 'released:' .. ARGV[1], 'PX', ARGV[2])
    return 1
end
return 0
"""


class BeatLock:
    """A lease on ``key`` in Redis, held by ``owner`` for ``ttl_s`` after each ``hold``."""

    def __init__(
        self, client: redis.Redis, *, ttl_s: float, key: str = LOCK_KEY, owner: str = ""
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("the lease must last a positive time")
        self.client = client
        self.key = key
        self.ttl_ms = int(ttl_s * 1000)
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def hold(self) -> bool:
        """Take or renew the lease; False while another owner holds it."""
        return bool(self.client.eval(_HOLD, 1, self.key, self.owner, self.ttl_ms))

    def holder(self) -> str | None:
        """Who holds the lease; None when nobody does (a released one included)."""
        value = self.client.get(self.key)
        if value is None:
            return None
        holder = value.decode() if isinstance(value, bytes) else str(value)
        return None if holder.startswith(RELEASED) else holder

    def release(self) -> None:
        self.client.eval(_RELEASE, 1, self.key, self.owner, self.ttl_ms)


def beat_lock() -> BeatLock | None:
    """The lock of this installation's beats; None without Redis."""
    if not settings.REDIS_URL:
        return None
    ttl_s = float(os.environ.get("SHUNTER_BEAT_LOCK_TTL_S", DEFAULT_TTL_S))
    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5, socket_timeout=5)
    return BeatLock(client, ttl_s=ttl_s)


class LeaderScheduler(DatabaseScheduler):  # type: ignore[misc]
    """``DatabaseScheduler`` that runs only while it holds the beat lock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.lock = beat_lock()
        self.leading: bool | None = None  # None: not known yet
        self.closed = False
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if self.closed:
            # Celery's SIGTERM handler closes the scheduler (releasing the lease), then
            # raises SystemExit; a publish in flight can swallow it (kombu retries on the
            # closed connection and raises its own error, which beat logs and goes on
            # from). Exit here instead of running on, and taking the lease back once the
            # release's tombstone expires, in a beat that was told to stop.
            raise SystemExit()
        if self.lock is not None and not self._lead():
            return min(IDLE_S, self.lock.ttl_ms / 1000)
        return float(super().tick(*args, **kwargs))

    def _lead(self) -> bool:
        assert self.lock is not None
        try:
            leading = self.lock.hold()
        except redis.RedisError as e:
            # Without the lock nobody can tell who leads: fire nothing rather than twice.
            log.warning("beat: the lock in Redis is unreachable (%s); idling", e)
            self.leading = None
            return False
        if leading != self.leading:
            if leading:
                log.info("beat: holding the beat lock (%s); running the schedule", self.lock.owner)
            else:
                log.warning(
                    "beat: another beat (%s) holds the beat lock; this one idles until it "
                    "stops (run one beat per installation)",
                    self.lock.holder(),
                )
        self.leading = leading
        return leading

    def close(self) -> None:
        self.closed = True
        if self.lock is not None and self.leading:
            try:
                self.lock.release()
            except redis.RedisError:
                log.warning("beat: could not release the beat lock; it expires on its own")
        super().close()
