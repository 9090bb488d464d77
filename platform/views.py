from __future__ import annotations

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
    """Liveness and database reachability, for load balancers and compose health checks."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception:  # the probe reports any database failure as unhealthy
        return JsonResponse({"status": "unhealthy", "database": "unreachable"}, status=503)
    return JsonResponse({"status": "ok", "database": connection.vendor, "debug": settings.DEBUG})
