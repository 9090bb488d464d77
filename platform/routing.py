"""Websocket routes of the ASGI application; each app's consumers are added here."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver

websocket_urlpatterns: list[URLPattern | URLResolver] = []
