"""Tenant quotas: requests per minute, tokens per minute, concurrent sequences and a
token budget per day or month, checked and counted atomically.

A request asks for ``sequences`` (prompts x ``n``: what the engine runs at once) and
``reserve`` tokens (an upper estimate of its prompt plus ``max_tokens`` per sequence).
Semantics (both limiters implement exactly these):

- **Requests per minute**: a sliding window. A request is admitted while fewer than
  ``rpm`` requests were admitted in the last 60 s; refused requests do not count, nor
  do requests settled with ``refund`` (they failed before the engine accepted them).
- **Tokens per minute**: fixed windows of 60 s aligned to the epoch minute. Admission
  reserves ``reserve`` tokens in the window of the admission; when the response ends
  (``settle``) the reservation is replaced by the tokens used (prompt plus completion),
  in that same window. A request is admitted while its window has used fewer than
  ``tpm`` tokens and its reservation fits what is left (``used + reserve <= tpm``).
- **Concurrent sequences**: a lease per admitted request weighing its ``sequences``,
  given back when it ends; a request is admitted while the leases' weights plus its
  own stay within ``concurrency``. A lease lives ``lease_ttl_s`` (``LEASE_TTL_S``, 30 s)
  and the running request renews it every quarter of that (``LeaseHold``), so a lease
  never given back (a crashed gateway, a settle that never got through) lapses at most
  ``lease_ttl_s`` after its request ended, however long requests may run.
- **Token budget**: tokens counted per UTC day and month (reserved, then settled, in
  the periods of the admission); a request is admitted while the period has used fewer
  than ``token_budget`` and its reservation fits what is left. The estimate of a prompt
  may fall short (settle corrects it), so a budget may still be overshot by a little.

Refusals name the limit: ``budget`` (OpenAI's ``insufficient_quota``), ``concurrency``,
``requests``, ``tokens`` (``rate_limit_exceeded``), with a retry delay and the numbers for
the ``x-ratelimit-*`` headers. A request that could never be admitted (a reservation over
``tpm`` or ``token_budget``, more sequences than ``concurrency``) is refused as
``too_large``, with no retry delay: waiting would not help.

With Redis (``REDIS_URL``) every check-and-increment is ONE Lua script, so gateways in
many processes never over-admit; without it (the embedded default, one process) an
in-process limiter under a lock does the same. When Redis cannot be reached the Redis
limiter raises ``QuotaUnavailable`` (callers fail closed) and logs one line at most every
``UNAVAILABLE_LOG_S`` seconds, without a traceback. A settle that fails so is retried in
the background with backoff (``LeaseHold.release``) for as long as its lease would live;
then the lease has lapsed on its own and only the token correction is lost.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import logging
import math
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

if TYPE_CHECKING:
    import redis.asyncio

    from shunter.tenants.models import Tenant

WINDOW_S = 60.0
# A running request renews its lease every LEASE_TTL_S / 4: a renewal lost to a Redis
# hiccup (a 5 s socket timeout, tried twice) leaves time for the next, and a lease whose
# request ended without giving it back locks its tenant out for at most this long.
LEASE_TTL_S = 30.0
RENEWALS_PER_TTL = 4
# Backoff of a settle that failed: from the first delay, doubled up to the last.
SETTLE_RETRY_S = (0.1, 5.0)
CONCURRENCY_RETRY_S = 1.0
# At most one "Redis unreachable" line per this many seconds: an outage refuses every
# request, and a line each would bury the log.
UNAVAILABLE_LOG_S = 10.0

log = logging.getLogger("shunter.quotas")

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
    """The answer to one check-and-increment. When admitted, the caller ends it with
    ``settle`` (which gives back ``lease`` when set and replaces the ``reserved`` tokens,
    counted in the windows of ``at``, by the tokens used; a refund also takes ``entry``,
    its place in the requests-per-minute window, back out). ``refused`` names the limit
    that refused it; ``too_large`` says the request could never be admitted under it.
    ``requests_used`` counts this request when admitted, ``tokens_used`` and
    ``budget_used`` its reservation; the ``*_reset_s`` fields are seconds until the
    window frees capacity."""

    admitted: bool
    limits: Limits
    refused: str | None = None
    too_large: bool = False
    sequences: int = 1
    reserved: int = 0
    at: float = 0.0
    lease: str | None = None
    entry: str | None = None
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
        if not self.admitted and not self.too_large:
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
        if self.too_large:
            if self.refused == "concurrency":
                return (
                    f"This request runs {self.sequences} sequences at once, more than the "
                    f"concurrency limit of {limits.concurrency}: reduce the prompts or 'n'."
                )
            limit = (
                f"the token budget of {limits.token_budget} tokens per {limits.budget_period}"
                if self.refused == "budget"
                else f"the limit of {limits.tpm} tokens per minute"
            )
            return (
                f"This request may use up to {self.reserved} tokens (its prompt plus "
                f"max_tokens for each of its {self.sequences} sequences), more than {limit}: "
                "reduce max_tokens, 'n' or the prompt."
            )
        if self.refused == "budget":
            return (
                f"You exceeded your token budget of {limits.token_budget} tokens per "
                f"{limits.budget_period} ({self.budget_used} used, this request may use up "
                f"to {self.reserved})."
            )
        if self.refused == "concurrency":
            return (
                f"Too many concurrent requests: the limit is {limits.concurrency} sequences "
                f"and this request runs {self.sequences}."
            )
        if self.refused == "requests":
            return f"Rate limit reached: {limits.rpm} requests per minute."
        return (
            f"Rate limit reached: {limits.tpm} tokens per minute ({self.tokens_used} used, "
            f"this request may use up to {self.reserved})."
        )


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


class QuotaUnavailable(Exception):
    """The quota store cannot be reached: the caller must fail closed (refuse)."""


class QuotaLimiter(ABC):
    """Check-and-increment of a tenant's quotas (see the module's semantics). ``tenant``
    is any stable string naming the tenant (its id). ``clock`` gives Unix seconds."""

    def __init__(self, *, clock: Callable[[], float] = time.time, lease_ttl_s: float = LEASE_TTL_S):
        self.clock = clock
        self.lease_ttl_s = lease_ttl_s

    async def admit(
        self, tenant: str, limits: Limits, lease: str, *, sequences: int = 1, reserve: int = 0
    ) -> Admission:
        """Admit one request of ``sequences`` sequences reserving ``reserve`` tokens under
        ``limits``, or refuse it, atomically. An admitted request holds ``lease`` (a
        fresh unique id) until ``settle``. Raises ``QuotaUnavailable``."""
        sequences, reserve = max(1, sequences), max(0, reserve)
        now = self.clock()
        refused = None
        if limits.concurrency is not None and sequences > limits.concurrency:
            refused = "concurrency"
        elif limits.tpm is not None and reserve > limits.tpm:
            refused = "tokens"
        elif limits.token_budget is not None and reserve > limits.token_budget:
            refused = "budget"
        if refused is not None:
            return Admission(
                admitted=False,
                limits=limits,
                refused=refused,
                too_large=True,
                sequences=sequences,
                reserved=reserve,
                at=now,
            )
        return await self._admit(tenant, limits, lease, sequences, reserve, now)

    @abstractmethod
    async def _admit(
        self, tenant: str, limits: Limits, lease: str, sequences: int, reserve: int, now: float
    ) -> Admission:
        """``admit`` once the request could fit ``limits`` at all."""

    async def settle(
        self, tenant: str, admission: Admission, tokens: int, *, refund: bool = False
    ) -> None:
        """The admitted request ended having used ``tokens`` (prompt plus completion):
        give back its lease and replace its reservation by ``tokens``; with ``refund``
        (it failed before the engine accepted it) it also leaves the requests-per-minute
        window. Raises ``QuotaUnavailable``."""
        entry = admission.entry if refund else None
        await self._count(tenant, admission.lease, tokens - admission.reserved, admission.at, entry)

    async def renew(self, tenant: str, admission: Admission) -> None:
        """Extend the admitted request's lease to ``lease_ttl_s`` from now; a lease given
        back or lapsed stays so. Raises ``QuotaUnavailable``."""
        if admission.lease is not None:
            await self._renew(tenant, admission.lease, self.clock() + self.lease_ttl_s)

    def hold(self, tenant: str, admission: Admission) -> LeaseHold:
        """The running request's hold on its admission (started: renewing its lease)."""
        return LeaseHold(self, tenant, admission)

    @abstractmethod
    async def _count(
        self, tenant: str, lease: str | None, tokens: int, at: float, entry: str | None
    ) -> None:
        """Give back ``lease`` (when set), take ``entry`` (when set) out of the requests
        window, and add ``tokens`` (negative: give back) to the tokens-per-minute window
        and budget periods of the time ``at``; windows and periods already over are left
        as they are (nothing asks about them again)."""

    @abstractmethod
    async def _renew(self, tenant: str, lease: str, expiry: float) -> None:
        """Move ``lease``'s expiry to ``expiry`` if it is still held."""

    @abstractmethod
    async def reset(self, tenant: str) -> None:
        """Forget every count of ``tenant`` (an operator's reset)."""

    async def aclose(self) -> None:  # noqa: B027 (only network limiters hold connections)
        """Close the connections this event loop opened."""


class LeaseHold:
    """An admitted request's admission while it runs and after it ends, the same for
    every limiter: it renews the lease every ``lease_ttl_s / RENEWALS_PER_TTL`` (a lease
    lapses ``lease_ttl_s`` after its last renewal) until ``release`` settles it. A settle
    the store does not take (``QuotaUnavailable``) is retried in the background, with
    backoff (``SETTLE_RETRY_S``), until it gets through or ``lease_ttl_s`` has passed:
    by then the lease has lapsed on its own, and the limiter logged the outage."""

    # Renewals and retries, referenced until done (the loop keeps weak references only).
    _tasks: ClassVar[set[asyncio.Task[None]]] = set()

    def __init__(self, limiter: QuotaLimiter, tenant: str, admission: Admission) -> None:
        self.limiter = limiter
        self.tenant = tenant
        self.admission = admission
        self._renewing: asyncio.Task[None] | None = None
        if admission.lease is not None:
            self._renewing = self._spawn(self._renew_forever())

    @classmethod
    def _spawn(cls, job: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(job)
        cls._tasks.add(task)
        task.add_done_callback(cls._tasks.discard)
        return task

    async def _renew_forever(self) -> None:
        every_s = self.limiter.lease_ttl_s / RENEWALS_PER_TTL
        while True:
            await asyncio.sleep(every_s)
            # The limiter logs an outage; the next renewal may get through.
            with contextlib.suppress(QuotaUnavailable):
                await self.limiter.renew(self.tenant, self.admission)

    async def release(self, tokens: int, *, refund: bool = False) -> bool:
        """Stop renewing and settle (``QuotaLimiter.settle``); True when it got through
        at once, False when it is retried in the background."""
        if self._renewing is not None:
            self._renewing.cancel()
        try:
            await self.limiter.settle(self.tenant, self.admission, tokens, refund=refund)
        except QuotaUnavailable:
            self._spawn(self._settle_later(tokens, refund, self.limiter.clock()))
            return False
        return True

    async def _settle_later(self, tokens: int, refund: bool, ended: float) -> None:
        delay_s, max_s = SETTLE_RETRY_S
        lapsed = ended + self.limiter.lease_ttl_s  # the last renewal was before the end
        while (left_s := lapsed - self.limiter.clock()) > 0:
            await asyncio.sleep(min(delay_s, left_s))
            try:
                await self.limiter.settle(self.tenant, self.admission, tokens, refund=refund)
            except QuotaUnavailable:
                delay_s = min(2 * delay_s, max_s)
            else:
                return
        log.warning(
            "tenant %s: a request's quotas were not settled within %g s; its lease "
            "lapsed, its reservation of %d tokens stays counted",
            self.tenant,
            self.limiter.lease_ttl_s,
            self.admission.reserved,
        )


@dataclass
class _TenantCounts:
    # (admission time, entry) of the requests in the window, oldest first
    admitted: deque[tuple[float, str]] = field(default_factory=deque)
    leases: dict[str, tuple[float, int]] = field(default_factory=dict)  # -> expiry, weight
    tokens: dict[int, int] = field(default_factory=dict)  # minute window -> tokens
    budget: dict[str, int] = field(default_factory=dict)  # period name -> tokens


class InProcessQuotaLimiter(QuotaLimiter):
    """The limiter of a single process (the embedded default): the same semantics as
    the Redis one, under a lock (gateways may run event loops in several threads)."""

    def __init__(self, *, clock: Callable[[], float] = time.time, lease_ttl_s: float = LEASE_TTL_S):
        super().__init__(clock=clock, lease_ttl_s=lease_ttl_s)
        self._lock = threading.Lock()
        self._tenants: dict[str, _TenantCounts] = {}

    async def _admit(
        self, tenant: str, limits: Limits, lease: str, sequences: int, reserve: int, now: float
    ) -> Admission:
        window = int(now // WINDOW_S)
        tokens_reset = (window + 1) * WINDOW_S - now
        period, budget_reset = budget_period(now, limits.budget_period)
        with self._lock:
            c = self._tenants.setdefault(tenant, _TenantCounts())
            while c.admitted and c.admitted[0][0] <= now - WINDOW_S:
                c.admitted.popleft()
            for key in [k for k, (expiry, _) in c.leases.items() if expiry <= now]:
                del c.leases[key]
            for old in [w for w in c.tokens if w < window]:
                del c.tokens[old]
            requests = len(c.admitted)
            requests_reset = c.admitted[0][0] + WINDOW_S - now if c.admitted else 0.0
            leased = sum(weight for _, weight in c.leases.values())
            tokens = c.tokens.get(window, 0)
            budget = c.budget.get(period, 0)
            refused: str | None = None
            retry = 0.0
            if limits.token_budget is not None and (
                budget >= limits.token_budget or budget + reserve > limits.token_budget
            ):
                refused, retry = "budget", budget_reset
            elif limits.concurrency is not None and leased + sequences > limits.concurrency:
                refused, retry = "concurrency", CONCURRENCY_RETRY_S
            elif limits.rpm is not None and requests >= limits.rpm:
                refused, retry = "requests", requests_reset
            elif limits.tpm is not None and (tokens >= limits.tpm or tokens + reserve > limits.tpm):
                refused, retry = "tokens", tokens_reset
            if refused is None:
                if limits.rpm is not None:
                    c.admitted.append((now, lease))
                    requests += 1
                    requests_reset = c.admitted[0][0] + WINDOW_S - now
                if limits.concurrency is not None:
                    c.leases[lease] = (now + self.lease_ttl_s, sequences)
                if reserve:
                    self._add(c, reserve, now, now)
                    tokens += reserve
                    budget += reserve
        return Admission(
            admitted=refused is None,
            limits=limits,
            refused=refused,
            sequences=sequences,
            reserved=reserve,
            at=now,
            lease=lease if refused is None and limits.concurrency is not None else None,
            entry=lease if refused is None and limits.rpm is not None else None,
            retry_after_s=retry,
            requests_used=requests,
            requests_reset_s=requests_reset,
            tokens_used=tokens,
            tokens_reset_s=tokens_reset,
            budget_used=budget,
        )

    @staticmethod
    def _add(c: _TenantCounts, tokens: int, at: float, now: float) -> None:
        """Add ``tokens`` to the window and periods of ``at`` that are still current."""
        window = int(at // WINDOW_S)
        if window >= int(now // WINDOW_S):
            c.tokens[window] = c.tokens.get(window, 0) + tokens
        current = {budget_period(now, p)[0] for p in ("day", "month")}
        for p in ("day", "month"):
            name = budget_period(at, p)[0]
            if name in current:
                c.budget[name] = c.budget.get(name, 0) + tokens
        # Keep only the current periods: the budget is never asked about older ones.
        for old in [p for p in c.budget if p not in current]:
            del c.budget[old]

    async def _count(
        self, tenant: str, lease: str | None, tokens: int, at: float, entry: str | None
    ) -> None:
        now = self.clock()
        with self._lock:
            c = self._tenants.setdefault(tenant, _TenantCounts())
            if lease is not None:
                c.leases.pop(lease, None)
            if entry is not None:
                c.admitted = deque(a for a in c.admitted if a[1] != entry)
            if tokens:
                self._add(c, tokens, at, now)

    async def _renew(self, tenant: str, lease: str, expiry: float) -> None:
        with self._lock:
            c = self._tenants.get(tenant)
            held = None if c is None else c.leases.get(lease)
            if c is not None and held is not None and held[0] > self.clock():
                c.leases[lease] = (expiry, held[1])

    async def reset(self, tenant: str) -> None:
        with self._lock:
            self._tenants.pop(tenant, None)


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
