from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from shunter.platform import runtime


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """The landing page: what this platform runs on and where to go next."""
    return render(request, "platform/home.html", {"runtime": runtime.describe()})


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness and the reachability of the database and (when ``REDIS_URL`` is set)
    Redis, each its own check, for load balancers and compose health checks: 200 when
    every check answers; else 503, ``down`` naming the checks that failed (each of those
    is ``"unreachable"``)."""
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        checks["database"] = connection.vendor
    except Exception:  # the probe reports any database failure as unhealthy
        checks["database"] = UNREACHABLE
    if settings.REDIS_URL:
        checks["redis"] = "ok" if _redis_answers(settings.REDIS_URL) else UNREACHABLE
    down = [name for name, state in checks.items() if state == UNREACHABLE]
    if down:
        return JsonResponse({"status": "unhealthy", "down": down, **checks}, status=503)
    return JsonResponse({"status": "ok", **checks, "debug": settings.DEBUG})


UNREACHABLE = "unreachable"
# A probe answers within about this long when Redis is down or hangs.
REDIS_PROBE_TIMEOUT_S = 1.0
_redis_clients: dict[str, Any] = {}


def _redis_answers(url: str) -> bool:
    """Whether Redis at ``url`` answers a PING within ``REDIS_PROBE_TIMEOUT_S`` (one
    client per URL, kept: its pooled connection makes a probe one round trip)."""
    import redis

    client = _redis_clients.get(url)
    if client is None:
        client = _redis_clients[url] = redis.Redis.from_url(
            url,
            socket_connect_timeout=REDIS_PROBE_TIMEOUT_S,
            socket_timeout=REDIS_PROBE_TIMEOUT_S,
        )
    try:
        return bool(client.ping())
    except Exception:  # the probe reports any Redis failure as unhealthy
        return False
