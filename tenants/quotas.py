"""Tenant quotas: requests per minute, tokens per minute, concurrent requests and a token
budget per day or month, checked and counted atomically.

Semantics (both limiters implement exactly these):

- **Requests per minute**: a sliding window. A request is admitted while fewer than
  ``rpm`` requests were admitted in the last 60 s; refused requests do not count.
- **Tokens per minute**: fixed windows of 60 s aligned to the epoch minute. Tokens
  (prompt plus completion) are counted when a response ends, in the window of its end;
  a request is admitted while its window has used fewer than ``tpm`` tokens.
- **Concurrent requests**: a lease per admitted request, given back on completion; a lease
  never given back (a crashed gateway) lapses after ``lease_ttl_s`` (the safety net).
- **Token budget**: tokens counted per UTC day or month; a request is admitted while the
  period has used fewer than ``token_budget``. Usage is known only when a response ends,
  so a budget may be overshot by the requests in flight when it runs out; the next
  request is refused.

Refusals name the limit: ``budget`` (OpenAI's ``insufficient_quota``), ``concurrency``,
``requests``, ``tokens`` (``rate_limit_exceeded``), with a retry delay and the numbers for
the ``x-ratelimit-*`` headers.

With Redis (``REDIS_URL``) every check-and-increment is ONE Lua script, so gateways in
many processes never over-admit; without it (the embedded default, one process) an
in-process limiter under a lock does the same.
"""

from __future__ import annotations

import asyncio
import calendar
import math
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import redis.asyncio

    from shunter.tenants.models import Tenant

WINDOW_S = 60.0
LEASE_TTL_S = 900.0  # longer than any request the gateway lets run
CONCURRENCY_RETRY_S = 1.0

T = TypeVar("T")


class LoopLocal(Generic[T]):
    """One ``T`` per running event loop, made on first use: asyncio clients (aiohttp
    sessions, Redis pools) are bound to the loop that made them."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._values: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        value = self._values.get(loop)
        if value is None:
            value = self._values[loop] = self._factory()
        return value

    def pop(self) -> T | None:
        """This loop's value, forgotten (the caller closes it)."""
        return self._values.pop(asyncio.get_running_loop(), None)


@dataclass(frozen=True)
class Limits:
    """A tenant's quotas; None is unlimited. ``budget_period`` is ``day`` or ``month``."""

    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None
    token_budget: int | None = None
    budget_period: str = "day"

    def __post_init__(self) -> None:
        if self.budget_period not in ("day", "month"):
            raise ValueError(f"budget_period must be 'day' or 'month', not {self.budget_period!r}")

    @classmethod
    def of(cls, tenant: Tenant) -> Limits:
        return cls(
            rpm=tenant.rpm_limit,
            tpm=tenant.tpm_limit,
            concurrency=tenant.concurrency_limit,
            token_budget=tenant.token_budget,
            budget_period=tenant.budget_period,
        )

    @property
    def unlimited(self) -> bool:
        return (self.rpm, self.tpm, self.concurrency, self.token_budget) == (None,) * 4


@dataclass(frozen=True)
class Admission:
    """The answer to one check-and-increment. When admitted and ``lease`` is set, the
    caller gives it back with ``release``. ``refused`` names the limit that refused it.
    ``requests_used`` counts this request when admitted; the ``*_reset_s`` fields are
    seconds until the window frees capacity."""

    admitted: bool
    limits: Limits
    refused: str | None = None
    lease: str | None = None
    retry_after_s: float = 0.0
    requests_used: int = 0
    requests_reset_s: float = 0.0
    tokens_used: int = 0
    tokens_reset_s: float = 0.0
    budget_used: int = 0

    def headers(self) -> dict[str, str]:
        """``Retry-After`` when refused, and the ``x-ratelimit-*`` headers of the limits
        that are set (OpenAI's names)."""
        out: dict[str, str] = {}
        if not self.admitted:
            out["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
            out["retry-after-ms"] = str(max(1, math.ceil(1000 * self.retry_after_s)))
        rpm, tpm = self.limits.rpm, self.limits.tpm
        if rpm is not None:
            out["x-ratelimit-limit-requests"] = str(rpm)
            out["x-ratelimit-remaining-requests"] = str(max(0, rpm - self.requests_used))
            out["x-ratelimit-reset-requests"] = _duration(self.requests_reset_s)
        if tpm is not None:
            out["x-ratelimit-limit-tokens"] = str(tpm)
            out["x-ratelimit-remaining-tokens"] = str(max(0, tpm - self.tokens_used))
            out["x-ratelimit-reset-tokens"] = _duration(self.tokens_reset_s)
        return out

    @property
    def error_code(self) -> str:
        """OpenAI's error code of the refusal."""
        return "insufficient_quota" if self.refused == "budget" else "rate_limit_exceeded"

    def message(self) -> str:
        limits = self.limits
        if self.refused == "budget":
            return (
                f"You exceeded your token budget of {limits.token_budget} tokens per "
                f"{limits.budget_period} ({self.budget_used} used)."
            )
        if self.refused == "concurrency":
            return f"Too many concurrent requests: the limit is {limits.concurrency}."
        if self.refused == "requests":
            return f"Rate limit reached: {limits.rpm} requests per minute."
        return f"Rate limit reached: {limits.tpm} tokens per minute ({self.tokens_used} used)."


def _duration(seconds: float) -> str:
    return f"{max(0.0, seconds):.3f}s"


def budget_period(now: float, period: str) -> tuple[str, float]:
    """The UTC period holding ``now``: its name (``20250131`` or ``202501``) and the
    seconds left until it ends."""
    day = datetime.fromtimestamp(now, UTC)
    if period == "day":
        start = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
        return day.strftime("%Y%m%d"), start + 86400 - now
    days = calendar.monthrange(day.year, day.month)[1]
    start = datetime(day.year, day.month, 1, tzinfo=UTC).timestamp()
    return day.strftime("%Y%m"), start + days * 86400 - now


class QuotaLimiter(ABC):
    """Check-and-increment of a tenant's quotas (see the module's semantics). ``tenant``
    is any stable string naming the tenant (its id). ``clock`` gives Unix seconds."""

    def __init__(self, *, clock: Callable[[], float] = time.time, lease_ttl_s: float = LEASE_TTL_S):
        self.clock = clock
        self.lease_ttl_s = lease_ttl_s

    @abstractmethod
    async def admit(self, tenant: str, limits: Limits, lease: str) -> Admission:
        """Admit one request under ``limits`` or refuse it, atomically. An admitted
        request holds ``lease`` (a fresh unique id) until ``release``."""

    @abstractmethod
    async def release(self, tenant: str, lease: str) -> None:
        """Give back a concurrency lease (no-op if it is gone)."""

    @abstractmethod
    async def record_tokens(self, tenant: str, tokens: int) -> None:
        """Count ``tokens`` (prompt plus completion of a finished response) against the
        tokens-per-minute window and the budget periods."""

    @abstractmethod
    async def reset(self, tenant: str) -> None:
        """Forget every count of ``tenant`` (an operator's reset)."""

    async def aclose(self) -> None:  # noqa: B027 (only network limiters hold connections)
        """Close the connections this event loop opened."""


@dataclass
class _TenantCounts:
    admitted: deque[float] = field(default_factory=deque)  # admission times, oldest first
    leases: dict[str, float] = field(default_factory=dict)  # lease -> expiry
    tokens: dict[int, int] = field(default_factory=dict)  # minute window -> tokens
    budget: dict[str, int] = field(default_factory=dict)  # period name -> tokens


class InProcessQuotaLimiter(QuotaLimiter):
    """The limiter of a single process (the embedded default): the same semantics as
    the Redis one, under a lock (gateways may run event loops in several threads)."""

    def __init__(self, *, clock: Callable[[], float] = time.time, lease_ttl_s: float = LEASE_TTL_S):
        super().__init__(clock=clock, lease_ttl_s=lease_ttl_s)
        self._lock = threading.Lock()
        self._tenants: dict[str, _TenantCounts] = {}

    async def admit(self, tenant: str, limits: Limits, lease: str) -> Admission:
        now = self.clock()
        window = int(now // WINDOW_S)
        tokens_reset = (window + 1) * WINDOW_S - now
        period, budget_reset = budget_period(now, limits.budget_period)
        with self._lock:
            c = self._tenants.setdefault(tenant, _TenantCounts())
            while c.admitted and c.admitted[0] <= now - WINDOW_S:
                c.admitted.popleft()
            for key in [k for k, expiry in c.leases.items() if expiry <= now]:
                del c.leases[key]
            for old in [w for w in c.tokens if w < window]:
                del c.tokens[old]
            requests = len(c.admitted)
            requests_reset = c.admitted[0] + WINDOW_S - now if c.admitted else 0.0
            tokens = c.tokens.get(window, 0)
            budget = c.budget.get(period, 0)
            refused: str | None = None
            retry = 0.0
            if limits.token_budget is not None and budget >= limits.token_budget:
                refused, retry = "budget", budget_reset
            elif limits.concurrency is not None and len(c.leases) >= limits.concurrency:
                refused, retry = "concurrency", CONCURRENCY_RETRY_S
            elif limits.rpm is not None and requests >= limits.rpm:
                refused, retry = "requests", requests_reset
            elif limits.tpm is not None and tokens >= limits.tpm:
                refused, retry = "tokens", tokens_reset
            if refused is None:
                if limits.rpm is not None:
                    c.admitted.append(now)
                    requests += 1
                    requests_reset = c.admitted[0] + WINDOW_S - now
                if limits.concurrency is not None:
                    c.leases[lease] = now + self.lease_ttl_s
        return Admission(
            admitted=refused is None,
            limits=limits,
            refused=refused,
            lease=lease if refused is None and limits.concurrency is not None else None,
            retry_after_s=retry,
            requests_used=requests,
            requests_reset_s=requests_reset,
            tokens_used=tokens,
            tokens_reset_s=tokens_reset,
            budget_used=budget,
        )

    async def release(self, tenant: str, lease: str) -> None:
        with self._lock:
            c = self._tenants.get(tenant)
            if c is not None:
                c.leases.pop(lease, None)

    async def record_tokens(self, tenant: str, tokens: int) -> None:
        if tokens <= 0:
            return
        now = self.clock()
        window = int(now // WINDOW_S)
        with self._lock:
            c = self._tenants.setdefault(tenant, _TenantCounts())
            c.tokens[window] = c.tokens.get(window, 0) + tokens
            for period in ("day", "month"):
                name = budget_period(now, period)[0]
                c.budget[name] = c.budget.get(name, 0) + tokens
            # Keep only the current periods: the budget is never asked about older ones.
            current = {budget_period(now, p)[0] for p in ("day", "month")}
            for old in [p for p in c.budget if p not in current]:
                del c.budget[old]

    async def reset(self, tenant: str) -> None:
        with self._lock:
            self._tenants.pop(tenant, None)


# KEYS: requests log, leases, tokens window, budget period.
# ARGV: now, lease, rpm, tpm, concurrency, budget (-1: unlimited), lease ttl, seconds to the
# token window's end, seconds to the budget period's end, window length.
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

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local requests = redis.call('ZCARD', KEYS[1])
local function oldest_reset()
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if oldest[2] then return tonumber(oldest[2]) + window - now end
  return 0
end
local requests_reset = oldest_reset()
local tokens = tonumber(redis.call('GET', KEYS[3]) or '0')
local used = tonumber(redis.call('GET', KEYS[4]) or '0')

local refused = ''
local retry = 0
if budget >= 0 and used >= budget then
  refused, retry = 'budget', budget_reset
elseif conc >= 0 and redis.call('ZCARD', KEYS[2]) >= conc then
  refused, retry = 'concurrency', tonumber(ARGV[11])
elseif rpm >= 0 and requests >= rpm then
  refused, retry = 'requests', requests_reset
elseif tpm >= 0 and tokens >= tpm then
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
  redis.call('PEXPIRE', KEYS[2], math.ceil(ttl * 1000) + 1000)
end
return {1, '', requests, tostring(requests_reset), tokens, used, '0'}
"""

# KEYS: tokens window, day budget, month budget. ARGV: tokens, and each key's lifetime (ms).
_RECORD = """
local tokens = tonumber(ARGV[1])
for i = 1, 3 do
  redis.call('INCRBY', KEYS[i], tokens)
  redis.call('PEXPIRE', KEYS[i], ARGV[i + 1])
end
return 1
"""


class RedisQuotaLimiter(QuotaLimiter):
    """Quotas shared by every gateway process through Redis: each admission is one Lua
    script (check every limit, then count the request and take the lease), so concurrent
    requests are never over-admitted. Keys carry the tenant in a hash tag, so on a
    cluster all of a tenant's keys live on one slot."""

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

    def _connect(self) -> redis.asyncio.Redis:
        import redis.asyncio

        return redis.asyncio.Redis.from_url(self.url)

    def _key(self, tenant: str, name: str) -> str:
        return f"{self.prefix}:{{{tenant}}}:{name}"

    async def admit(self, tenant: str, limits: Limits, lease: str) -> Admission:
        now = self.clock()
        window = int(now // WINDOW_S)
        period, budget_reset = budget_period(now, limits.budget_period)

        def arg(limit: int | None) -> int:
            return -1 if limit is None else limit

        client = self._clients.get()
        reply = await client.eval(
            _ADMIT,
            4,
            self._key(tenant, "requests"),
            self._key(tenant, "leases"),
            self._key(tenant, f"tokens:{window}"),
            self._key(tenant, f"budget:{period}"),
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
        )
        admitted, refused, requests, requests_reset, tokens, used, retry = reply
        ok = bool(admitted)
        return Admission(
            admitted=ok,
            limits=limits,
            refused=None if ok else refused.decode(),
            lease=lease if ok and limits.concurrency is not None else None,
            retry_after_s=float(retry),
            requests_used=int(requests),
            requests_reset_s=float(requests_reset),
            tokens_used=int(tokens),
            tokens_reset_s=(window + 1) * WINDOW_S - now,
            budget_used=int(used),
        )

    async def release(self, tenant: str, lease: str) -> None:
        await self._clients.get().zrem(self._key(tenant, "leases"), lease)

    async def record_tokens(self, tenant: str, tokens: int) -> None:
        if tokens <= 0:
            return
        now = self.clock()
        window = int(now // WINDOW_S)
        day, day_left = budget_period(now, "day")
        month, month_left = budget_period(now, "month")
        await self._clients.get().eval(
            _RECORD,
            3,
            self._key(tenant, f"tokens:{window}"),
            self._key(tenant, f"budget:{day}"),
            self._key(tenant, f"budget:{month}"),
            tokens,
            # Each counter outlives its window by a margin, then Redis drops it.
            math.ceil(1000 * ((window + 1) * WINDOW_S - now + WINDOW_S)),
            math.ceil(1000 * (day_left + 3600)),
            math.ceil(1000 * (month_left + 3600)),
        )

    async def reset(self, tenant: str) -> None:
        client = self._clients.get()
        keys = [key async for key in client.scan_iter(match=self._key(tenant, "*"))]
        if keys:
            await client.delete(*keys)

    async def aclose(self) -> None:
        client = self._clients.pop()
        if client is not None:
            await client.aclose()


_limiter: QuotaLimiter | None = None
_limiter_lock = threading.Lock()


def quota_limiter() -> QuotaLimiter:
    """The process's limiter: Redis when ``REDIS_URL`` is set, else in-process."""
    global _limiter
    with _limiter_lock:
        if _limiter is None:
            from django.conf import settings

            url = settings.REDIS_URL
            _limiter = RedisQuotaLimiter(url) if url else InProcessQuotaLimiter()
        return _limiter
