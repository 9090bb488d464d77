"""The limiter of a single process (the embedded default), under a lock."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from shunter.gateway.quotas.admission import (
    CONCURRENCY_RETRY_S,
    WINDOW_S,
    Admission,
    Limits,
    budget_period,
)
from shunter.gateway.quotas.limiter import LEASE_TTL_S, QuotaLimiter


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
