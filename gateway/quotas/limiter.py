"""The limiter's contract (``QuotaLimiter``: admit, settle, renew) and a running
request's hold on its admission (``LeaseHold``), the same for every limiter."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar

from shunter.gateway.quotas.admission import Admission, Limits

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
