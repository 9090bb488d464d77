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

The package: ``admission`` (limits, the answer, headers and messages), ``limiter`` (the
contract and the lease hold), ``in_process`` and ``redis_limiter`` (the two limiters).
"""

from __future__ import annotations

import threading

from shunter.gateway.quotas.admission import Admission, Limits, budget_period
from shunter.gateway.quotas.in_process import InProcessQuotaLimiter
from shunter.gateway.quotas.limiter import LeaseHold, QuotaLimiter, QuotaUnavailable
from shunter.gateway.quotas.redis_limiter import RedisQuotaLimiter

__all__ = [
    "Admission",
    "InProcessQuotaLimiter",
    "LeaseHold",
    "Limits",
    "QuotaLimiter",
    "QuotaUnavailable",
    "RedisQuotaLimiter",
    "budget_period",
    "quota_limiter",
]

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
