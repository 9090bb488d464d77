"""Bearer key authentication of gateway requests.

``Authorization: Bearer sk-shunter-...``: the key is found by its displayed prefix and
accepted when the SHA-256 digest of the whole secret equals the stored one (compared in
constant time). What a key may do is cached in the process for ``ttl_s`` seconds (3 by
default), keyed by digest: a revocation, an expiry change, a scope change or a tenant
deactivation takes effect within that bound (an entry's age counts from the start of
its read). Unknown keys are cached too (bounded), so guessing does not reach the
database on every try. A key in use is read again in the background once its entry is
half as old as the bound, so a busy key's requests do not wait for the database; the
requests that do miss share one read per key. ``last_used_at`` is written at most
every ``touch_every_s`` seconds per key, off the request's path.

Refusals are OpenAI error bodies: 401 ``invalid_api_key`` for a missing, malformed,
unknown, revoked or expired key; 403 for an inactive tenant or a deployment outside the
key's scopes; 503 ``database_unavailable`` (with ``Retry-After``) when the key must be
read and the database is unreachable: cached keys keep being served until their entries
expire (``ttl_s``), and no longer. The secret never appears in a message or a log line.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from shunter.engine.api.errors import ApiError
from shunter.gateway.db import run_db
from shunter.gateway.quotas import Limits
from shunter.gateway.ttl_cache import TtlCache
from shunter.tenants.keys import looks_like_secret, secret_digest, secret_prefix

log = logging.getLogger("shunter.gateway.auth")

KEY_CACHE_S = 3.0
TOUCH_EVERY_S = 60.0
MAX_CACHED_KEYS = 10_000


def invalid_key(message: str) -> ApiError:
    return ApiError(401, message, type="invalid_request_error", code="invalid_api_key")


def forbidden(message: str, code: str) -> ApiError:
    return ApiError(403, message, type="permission_error", code=code)


@dataclass(frozen=True)
class KeyGrant:
    """What one key may do, as read from the database: its tenant, what it may use
    (``selectors.api_key_deployments`` and ``api_key_models``: the deployments it
    reached when read, and the models whose every deployment it reaches, one created
    since too), its expiry and revocation, the tenant's quotas, and the tenant's SLO
    class as ``X-Shunter-Slo`` (None: its requests take each deployment's class)."""

    api_key_id: int
    key_prefix: str
    tenant_id: int
    tenant_name: str
    tenant_active: bool
    deployment_ids: frozenset[int]
    model_names: frozenset[str]
    expires_at: datetime | None
    revoked: bool
    limits: Limits
    slo_header: str | None = None

    def check(self, now: datetime) -> None:
        """Raise the refusal of a revoked or expired key, or of an inactive tenant."""
        if self.revoked:
            raise invalid_key("This API key has been revoked.")
        if self.expires_at is not None and self.expires_at <= now:
            raise invalid_key("This API key has expired.")
        if not self.tenant_active:
            raise forbidden("This API key's tenant is not active.", "tenant_inactive")

    def may_use(self, deployment_id: int, model_name: str) -> bool:
        """Whether the key may use deployment ``deployment_id``, which serves
        ``model_name``."""
        return deployment_id in self.deployment_ids or model_name in self.model_names


def load_grant(secret: str) -> KeyGrant | None:
    """The grant of ``secret`` from the database, None if no key has its digest."""
    from shunter.tenants.models import ApiKey
    from shunter.tenants.selectors import api_key_deployments, api_key_models

    key = (
        ApiKey.objects.select_related("tenant__default_slo_class")
        .filter(prefix=secret_prefix(secret))
        .first()
    )
    if key is None or not hmac.compare_digest(secret_digest(secret), key.digest):
        return None
    tenant = key.tenant
    deployments = api_key_deployments(api_key=key).order_by().values_list("pk", flat=True)
    return KeyGrant(
        api_key_id=key.pk,
        key_prefix=key.prefix,
        tenant_id=tenant.pk,
        tenant_name=tenant.name,
        tenant_active=tenant.is_active,
        deployment_ids=frozenset(deployments),
        model_names=frozenset(api_key_models(api_key=key).values_list("name", flat=True)),
        expires_at=key.expires_at,
        revoked=key.revoked_at is not None,
        limits=Limits.of(tenant),
        slo_header=tenant.default_slo_class.header() if tenant.default_slo_class else None,
    )


def bearer_secret(header: str | None) -> str:
    """The secret of an ``Authorization: Bearer ...`` header (401 when there is none or
    it is not shaped like a Shunter key)."""
    if not header:
        raise invalid_key(
            "You didn't provide an API key. Send it as 'Authorization: Bearer sk-shunter-...'."
        )
    scheme, _, secret = header.strip().partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise invalid_key("The Authorization header must be 'Bearer <API key>'.")
    if not looks_like_secret(secret):
        raise invalid_key("Incorrect API key provided.")
    return secret


class KeyAuthenticator:
    """Authenticates bearer keys with a short-lived cache (see the module docstring).

    ``load`` reads a grant from the database (called in the gateway's database threads),
    ``touch`` records a key's use; ``clock`` is monotonic seconds (the cache's bounds),
    ``wall_clock`` the current time (keys' expiry, last use).
    """

    def __init__(
        self,
        *,
        ttl_s: float = KEY_CACHE_S,
        touch_every_s: float = TOUCH_EVERY_S,
        max_entries: int = MAX_CACHED_KEYS,
        load: Callable[[str], KeyGrant | None] = load_grant,
        touch: Callable[[int, datetime], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = timezone.now,
    ) -> None:
        self.ttl_s = ttl_s
        self.touch_every_s = touch_every_s
        self.max_entries = max_entries
        self._load = load
        self._touch = touch or _mark_used
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        # digest -> grant, or None for an unknown key (not read ahead: guesses wait)
        self.cache: TtlCache[str, KeyGrant | None] = TtlCache(
            ttl_s=ttl_s,
            max_entries=max_entries,
            clock=clock,
            refreshes=lambda grant: grant is not None,
        )
        self._touched: dict[int, float] = {}
        self._tasks: set[asyncio.Future[Any]] = set()

    async def authenticate(self, header: str | None) -> KeyGrant:
        """The grant of the key in ``header``, or the ApiError refusing it."""
        secret = bearer_secret(header)
        grant = await self.cache.get(secret_digest(secret), lambda: self._load(secret))
        if grant is None:
            raise invalid_key("Incorrect API key provided.")
        try:
            grant.check(self._wall_clock())
        except ApiError as e:
            log.info("key %s... refused: %s", grant.key_prefix, e.message)
            raise
        self._maybe_touch(grant.api_key_id, self._clock())
        return grant

    def forget(self) -> None:
        """Drop every cached grant (the next request of each key reads the database)."""
        self.cache.forget()

    def _maybe_touch(self, api_key_id: int, now: float) -> None:
        with self._lock:
            last = self._touched.get(api_key_id)
            if last is not None and now - last < self.touch_every_s:
                return
            self._touched[api_key_id] = now
        when = self._wall_clock()
        task = asyncio.ensure_future(run_db(lambda: self._touch(api_key_id, when)))
        self._tasks.add(task)
        task.add_done_callback(self._touched_done)

    def _touched_done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("could not record a key's last use: %r", task.exception())


def _mark_used(api_key_id: int, when: datetime) -> None:
    from shunter.tenants.services import api_key_mark_used

    api_key_mark_used(api_key_id=api_key_id, when=when)


authenticator = KeyAuthenticator()
