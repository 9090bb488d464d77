"""Throttling of password logins (the admin's and the console's): after
``LOGIN_FAILURE_LIMIT`` failed attempts within ``LOGIN_FAILURE_WINDOW_S`` for one user name,
or from one client address, further attempts for that name or from that address are
refused for ``LOGIN_COOLDOWN_S``, even with the right password. A successful login forgets
the failures of its name and address.

The counts live in Django's cache (Redis in production), so every web process sees the
same ones. ``ThrottledAuthenticationForm`` is the login form of both sites; the console's
page (``ThrottledLoginView``) answers a throttled attempt with 429.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse

PREFIX = "login-throttle"


def _keys(kind: str, value: str) -> tuple[str, str]:
    # Hashed: a user name may hold any character; the cache key must not.
    digest = hashlib.sha256(value.encode()).hexdigest()[:32]
    return f"{PREFIX}:{kind}:{digest}:failures", f"{PREFIX}:{kind}:{digest}:locked"


def _subjects(username: str, client_ip: str) -> list[tuple[str, str]]:
    # Case folded: ``Admin`` and ``admin`` share one count.
    return [_keys("user", username.casefold()), _keys("ip", client_ip)]


def client_ip(request: HttpRequest | None) -> str:
    """The client's address (the ASGI server takes it from trusted proxies' headers)."""
    return str(request.META.get("REMOTE_ADDR") or "unknown") if request is not None else "unknown"


def is_locked(username: str, client_ip: str) -> bool:
    """Whether logins for ``username`` or from ``client_ip`` are refused now."""
    locks = [locked for _, locked in _subjects(username, client_ip)]
    return bool(cache.get_many(locks))


def note_failure(username: str, client_ip: str) -> None:
    """Count a failed attempt; the ``LOGIN_FAILURE_LIMIT``-th in a window locks its name
    or address for ``LOGIN_COOLDOWN_S``."""
    for failures, locked in _subjects(username, client_ip):
        # add then incr: atomic in Redis, so concurrent failures all count.
        cache.add(failures, 0, timeout=settings.LOGIN_FAILURE_WINDOW_S)
        try:
            count = cache.incr(failures)
        except ValueError:  # the window ended between add and incr
            count = 1
            cache.set(failures, count, timeout=settings.LOGIN_FAILURE_WINDOW_S)
        if count >= settings.LOGIN_FAILURE_LIMIT:
            cache.set(locked, True, timeout=settings.LOGIN_COOLDOWN_S)
            cache.delete(failures)


def forget(username: str, client_ip: str) -> None:
    """Forget the failures and locks of ``username`` and ``client_ip``."""
    cache.delete_many([key for pair in _subjects(username, client_ip) for key in pair])


class ThrottledAuthenticationForm(AdminAuthenticationForm):
    """The staff login form with throttling: a locked name or address gets the
    ``throttled`` error before any password is checked."""

    error_messages = {
        **AdminAuthenticationForm.error_messages,
        "throttled": "Too many failed logins. Try again in %(minutes)d min.",
    }

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        ip = client_ip(self.request)
        if is_locked(username, ip):
            minutes = max(1, round(settings.LOGIN_COOLDOWN_S / 60))
            raise ValidationError(
                self.error_messages["throttled"], code="throttled", params={"minutes": minutes}
            )
        try:
            cleaned = super().clean()
        except ValidationError:
            if self.user_cache is None:  # wrong credentials, not a refused account
                note_failure(username, ip)
            raise
        forget(username, ip)
        return cleaned

    @property
    def throttled(self) -> bool:
        """Whether this form was refused for throttling."""
        return self.has_error("__all__", code="throttled")


class ThrottledLoginView(LoginView):
    """A login page with ``ThrottledAuthenticationForm`` that answers a throttled
    attempt with 429 (the form again, with its message)."""

    authentication_form = ThrottledAuthenticationForm

    def form_invalid(self, form: Any) -> HttpResponse:
        response = super().form_invalid(form)
        if isinstance(form, ThrottledAuthenticationForm) and form.throttled:
            response.status_code = 429
        return response
