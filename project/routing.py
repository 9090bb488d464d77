"""Websocket routes of the ASGI application; each app's consumers are added here."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from shunter.console.consumers import NodeConsumer, OverviewConsumer

websocket_urlpatterns: list[URLPattern | URLResolver] = [
    path("ws/console/overview/", OverviewConsumer.as_asgi()),
    path("ws/console/nodes/<int:node_id>/", NodeConsumer.as_asgi()),
]
