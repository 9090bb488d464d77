"""Quotas shared by every gateway process through Redis, one Lua script per
check-and-increment."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shunter.gateway.loop_local import LoopLocal
from shunter.gateway.quotas.admission import (
    CONCURRENCY_RETRY_S,
    WINDOW_S,
    Admission,
    Limits,
    budget_period,
)
from shunter.gateway.quotas.limiter import LEASE_TTL_S, QuotaLimiter, QuotaUnavailable, log

if TYPE_CHECKING:
    import redis.asyncio

# At most one "Redis unreachable" line per this many seconds: an outage refuses every
# request, and a line each would bury the log.
UNAVAILABLE_LOG_S = 10.0


# KEYS: requests log, leases (expiry by lease), lease weights, tokens window, day budget,
# month budget.
# ARGV: now, lease, rpm, tpm, concurrency, budget (-1: unlimited), lease ttl, seconds to the
# token window's end, seconds to the budget period's end, window length, concurrency retry,
# sequences, reserve, the budget's key (5: day, 6: month), the three counters' lifetimes (ms).
# Returns {admitted, refused, requests used, requests reset, tokens used, budget used, retry}
# with the fractional numbers as strings (Lua numbers become integers on the way back).
_ADMIT = """
local now = tonumber(ARGV[1])
local lease = ARGV[2]
local rpm = tonumber(ARGV[3])
local tpm = tonumber(ARGV[4])
local conc = tonumber(ARGV[5])
local budget = tonumber(ARGV[6])
local ttl = tonumber(ARGV[7])
local tokens_reset = tonumber(ARGV[8])
local budget_reset = tonumber(ARGV[9])
local window = tonumber(ARGV[10])
local sequences = tonumber(ARGV[12])
local reserve = tonumber(ARGV[13])
local budget_key = KEYS[tonumber(ARGV[14])]

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
if #lapsed > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  redis.call('HDEL', KEYS[3], unpack(lapsed))
end
local requests = redis.call('ZCARD', KEYS[1])
local function oldest_reset()
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if oldest[2] then return tonumber(oldest[2]) + window - now end
  return 0
end
local requests_reset = oldest_reset()
local tokens = tonumber(redis.call('GET', KEYS[4]) or '0')
local used = tonumber(redis.call('GET', budget_key) or '0')
local leased = 0
if conc >= 0 then
  local live = redis.call('ZRANGE', KEYS[2], 0, -1)
  if #live > 0 then
    for _, weight in ipairs(redis.call('HMGET', KEYS[3], unpack(live))) do
      leased = leased + (tonumber(weight) or 1)
    end
  end
end

local refused = ''
local retry = 0
if budget >= 0 and (used >= budget or used + reserve > budget) then
  refused, retry = 'budget', budget_reset
elseif conc >= 0 and leased + sequences > conc then
  refused, retry = 'concurrency', tonumber(ARGV[11])
elseif rpm >= 0 and requests >= rpm then
  refused, retry = 'requests', requests_reset
elseif tpm >= 0 and (tokens >= tpm or tokens + reserve > tpm) then
  refused, retry = 'tokens', tokens_reset
end
if refused ~= '' then
  return {0, refused, requests, tostring(requests_reset), tokens, used, tostring(retry)}
end
if rpm >= 0 then
  redis.call('ZADD', KEYS[1], now, lease)
  redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000) + 1000)
  requests = requests + 1
  requests_reset = oldest_reset()
end
if conc >= 0 then
  redis.call('ZADD', KEYS[2], now + ttl, lease)
  redis.call('HSET', KEYS[3], lease, sequences)
  redis.call('PEXPIRE', KEYS[2], math.ceil(ttl * 1000) + 1000)
  redis.call('PEXPIRE', KEYS[3], math.ceil(ttl * 1000) + 1000)
end
if reserve > 0 then
  for i = 4, 6 do
    redis.call('INCRBY', KEYS[i], reserve)
    redis.call('PEXPIRE', KEYS[i], ARGV[11 + i])
  end
  tokens = tokens + reserve
  used = used + reserve
end
return {1, '', requests, tostring(requests_reset), tokens, used, '0'}
"""

# KEYS: leases, lease weights, tokens window, day budget, month budget (of the time the
# tokens belong to), requests log. ARGV: lease ('': none), tokens (negative: given
# back), each counter's remaining lifetime (ms; not positive: its window is over, leave
# it), and the entry to take out of the requests log ('': none, the request counts).
_COUNT = """
if ARGV[1] ~= '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
end
if ARGV[6] ~= '' then
  redis.call('ZREM', KEYS[6], ARGV[6])
end
local tokens = tonumber(ARGV[2])
if tokens ~= 0 then
  for i = 3, 5 do
    local ttl = tonumber(ARGV[i])
    if ttl > 0 then
      redis.call('INCRBY', KEYS[i], tokens)
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
  end
end
return 1
"""

# KEYS: leases, lease weights. ARGV: now, lease, new expiry, the keys' lifetime (ms). A
# lease given back or lapsed is not taken again.
_RENEW = """
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[2])
if expiry and tonumber(expiry) > tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return 1
"""


class RedisQuotaLimiter(QuotaLimiter):
    """Quotas shared by every gateway process through Redis: each admission is one Lua
    script (check every limit, then count the request, take the lease and reserve the
    tokens), so concurrent requests are never over-admitted. Keys carry the tenant in a
    hash tag, so on a cluster all of a tenant's keys live on one slot. Connections time
    out fast and are retried once: an unreachable Redis is a ``QuotaUnavailable``
    within about a second, not a hung request."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "shunter:quota",
        clock: Callable[[], float] = time.time,
        lease_ttl_s: float = LEASE_TTL_S,
    ):
        super().__init__(clock=clock, lease_ttl_s=lease_ttl_s)
        self.url = url
        self.prefix = prefix
        self._clients: LoopLocal[Any] = LoopLocal(self._connect)
        self._logged_at = -math.inf
        self._log_lock = threading.Lock()

    def _connect(self) -> redis.asyncio.Redis:
        import redis.asyncio
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff

        return redis.asyncio.Redis.from_url(
            self.url,
            socket_connect_timeout=1.0,
            socket_timeout=5.0,
            # One retry reconnects a pooled connection the server closed (a restart, a
            # CLIENT KILL); more would only hold the request while Redis is down.
            retry=Retry(ExponentialBackoff(cap=0.1, base=0.01), 1),
        )

    def _key(self, tenant: str, name: str) -> str:
        return f"{self.prefix}:{{{tenant}}}:{name}"

    async def _eval(self, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run ``script``; a Redis that cannot answer is a ``QuotaUnavailable``."""
        import redis.exceptions

        try:
            return await self._clients.get().eval(script, len(keys), *keys, *args)
        except (redis.exceptions.RedisError, OSError) as e:
            self._unavailable(e)
            raise QuotaUnavailable(str(e)) from e

    def _unavailable(self, e: BaseException) -> None:
        now = time.monotonic()
        with self._log_lock:
            if now - self._logged_at < UNAVAILABLE_LOG_S:
                return
            self._logged_at = now
        log.warning("quota store %s unavailable, refusing requests: %r", self._redacted(), e)

    def _redacted(self) -> str:
        """The URL without its password (logs)."""
        import urllib.parse

        parts = urllib.parse.urlsplit(self.url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"

    def _lifetimes(self, at: float, now: float) -> list[int]:
        """The remaining lifetimes (ms) of the tokens window and the day and month
        budgets of time ``at``: each outlives its window by a margin, then Redis drops
        it; a window already over (it may have gone) gets none."""
        window = int(at // WINDOW_S)
        day_end = at + budget_period(at, "day")[1]
        month_end = at + budget_period(at, "month")[1]
        window_end = (window + 1) * WINDOW_S
        if window < int(now // WINDOW_S):
            window_end = now - WINDOW_S  # over: not counted
        ends = (window_end + WINDOW_S, day_end + 3600, month_end + 3600)
        return [math.ceil(1000 * (end - now)) for end in ends]

    def _token_keys(self, tenant: str, at: float) -> list[str]:
        window = int(at // WINDOW_S)
        day = budget_period(at, "day")[0]
        month = budget_period(at, "month")[0]
        return [
            self._key(tenant, f"tokens:{window}"),
            self._key(tenant, f"budget:{day}"),
            self._key(tenant, f"budget:{month}"),
        ]

    async def _admit(
        self, tenant: str, limits: Limits, lease: str, sequences: int, reserve: int, now: float
    ) -> Admission:
        window = int(now // WINDOW_S)
        budget_reset = budget_period(now, limits.budget_period)[1]

        def arg(limit: int | None) -> int:
            return -1 if limit is None else limit

        keys = [
            self._key(tenant, "requests"),
            self._key(tenant, "leases"),
            self._key(tenant, "lease-weights"),
            *self._token_keys(tenant, now),
        ]
        reply = await self._eval(
            _ADMIT,
            keys,
            [
                repr(now),
                lease,
                arg(limits.rpm),
                arg(limits.tpm),
                arg(limits.concurrency),
                arg(limits.token_budget),
                repr(self.lease_ttl_s),
                repr((window + 1) * WINDOW_S - now),
                repr(budget_reset),
                repr(WINDOW_S),
                repr(CONCURRENCY_RETRY_S),
                sequences,
                reserve,
                5 if limits.budget_period == "day" else 6,
                *self._lifetimes(now, now),
            ],
        )
        admitted, refused, requests, requests_reset, tokens, used, retry = reply
        ok = bool(admitted)
        return Admission(
            admitted=ok,
            limits=limits,
            refused=None if ok else refused.decode(),
            sequences=sequences,
            reserved=reserve,
            at=now,
            lease=lease if ok and limits.concurrency is not None else None,
            entry=lease if ok and limits.rpm is not None else None,
            retry_after_s=float(retry),
            requests_used=int(requests),
            requests_reset_s=float(requests_reset),
            tokens_used=int(tokens),
            tokens_reset_s=(window + 1) * WINDOW_S - now,
            budget_used=int(used),
        )

    async def _count(
        self, tenant: str, lease: str | None, tokens: int, at: float, entry: str | None
    ) -> None:
        if lease is None and entry is None and not tokens:
            return
        keys = [self._key(tenant, "leases"), self._key(tenant, "lease-weights")]
        keys += [*self._token_keys(tenant, at), self._key(tenant, "requests")]
        lifetimes = self._lifetimes(at, self.clock())
        await self._eval(_COUNT, keys, [lease or "", tokens, *lifetimes, entry or ""])

    async def _renew(self, tenant: str, lease: str, expiry: float) -> None:
        now = self.clock()
        keys = [self._key(tenant, "leases"), self._key(tenant, "lease-weights")]
        lifetime = math.ceil(1000 * (expiry - now)) + 1000
        await self._eval(_RENEW, keys, [repr(now), lease, repr(expiry), lifetime])

    async def reset(self, tenant: str) -> None:
        import redis.exceptions

        client = self._clients.get()
        try:
            keys = [key async for key in client.scan_iter(match=self._key(tenant, "*"))]
            if keys:
                await client.delete(*keys)
        except (redis.exceptions.RedisError, OSError) as e:
            self._unavailable(e)
            raise QuotaUnavailable(str(e)) from e

    async def aclose(self) -> None:
        client = self._clients.pop()
        if client is not None:
            await client.aclose()
