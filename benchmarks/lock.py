"""The target lock: one run per target at a time (a node's engine, an external URL,
a simulator job), held in the cache with an expiry so a dead worker's lock frees itself.
A run holds it under its own key, so anyone can tell whether a run is being executed."""

from __future__ import annotations

import hashlib
import math

from django.core.cache import cache

# The target lock outlives the run's own timeout by this much (a dead worker's lock
# expires by itself; a run this much past its timeout without its lock has no worker),
# and a queued run waits at most LOCK_WAIT_S for its target.
LOCK_MARGIN_S = 120.0
LOCK_WAIT_S = 6 * 3600.0
LOCK_RETRY_S = 1.0


def _lock_cache_key(lock_key: str) -> str:
    return "shunter:benchmark-lock:" + hashlib.sha256(lock_key.encode()).hexdigest()[:32]


def lock_acquire(lock_key: str, token: str, ttl_s: float) -> bool:
    return bool(cache.add(_lock_cache_key(lock_key), token, timeout=math.ceil(ttl_s)))


def lock_release(lock_key: str, token: str) -> None:
    key = _lock_cache_key(lock_key)
    if cache.get(key) == token:  # never another run's lock (ours may have expired)
        cache.delete(key)


def target_busy(lock_key: str) -> bool:
    """Whether some run holds ``lock_key``'s target now."""
    return cache.get(_lock_cache_key(lock_key)) is not None


def lock_held_by(lock_key: str, token: str) -> bool:
    """Whether ``token`` (a run's key) holds ``lock_key``'s target now."""
    return bool(cache.get(_lock_cache_key(lock_key)) == token)
