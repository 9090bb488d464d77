"""Websockets of the live console: ``/ws/console/overview/`` and
``/ws/console/nodes/<id>/``.

Staff only: anyone else is refused before the handshake completes (close code 4403;
an unknown node is 4404). On connect the consumer sends a ``snapshot`` message with the
topic's current numbers, joins the topic's group, then forwards the broadcaster's
``delta`` messages (see ``deltas``) until the socket closes.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from shunter.console import selectors
from shunter.console.broadcaster import broadcaster
from shunter.console.deltas import OVERVIEW_GROUP, node_group

CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404


class ConsoleConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """A topic's group and its first snapshot; subclasses say which."""

    group: str | None = None

    def topic(self) -> tuple[str, Any] | None:
        """The group and the snapshot (runs in a worker thread: may query); None when
        the topic does not exist."""
        raise NotImplementedError

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not (user.is_active and user.is_staff):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        topic = await database_sync_to_async(self.topic)()
        if topic is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        group, data = topic
        await self.channel_layer.group_add(group, self.channel_name)
        self.group = group
        await self.accept()
        await self.send_json({"type": "snapshot", "data": data})
        broadcaster().join()

    async def disconnect(self, code: int) -> None:
        if self.group is None:
            return
        await self.channel_layer.group_discard(self.group, self.channel_name)
        self.group = None
        await broadcaster().leave()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients only listen; whatever they send is ignored."""

    async def console_delta(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "delta", "data": event["delta"]})


class OverviewConsumer(ConsoleConsumer):
    """Every tenant's attainment rows and series."""

    def topic(self) -> tuple[str, Any] | None:
        return OVERVIEW_GROUP, selectors.overview()


class NodeConsumer(ConsoleConsumer):
    """One node's memory map, turn, requests, transfer rates and step times."""

    def topic(self) -> tuple[str, Any] | None:
        node_id = int(self.scope["url_route"]["kwargs"]["node_id"])
        views = selectors.node_views([node_id])
        view = views.get(str(node_id))
        return None if view is None else (node_group(node_id), view)
