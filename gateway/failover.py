"""The replicas one request is sent to: the one it was routed to, then, when that one
fails before a byte of the answer reached the client, one other replica of the model
(``MAX_ATTEMPTS`` tries in all), the failed one cooled down (``balancer``).
"""

from __future__ import annotations

import logging

from shunter.engine.api.errors import ApiError
from shunter.gateway.auth import KeyGrant
from shunter.gateway.routes import Route, routes

log = logging.getLogger("shunter.gateway")

# Tries of a request that fails before its first byte reached the client: the first
# replica, then one other.
MAX_ATTEMPTS = 2


class Failover:
    """One request's replicas: ``route`` is the one it is on, and the one the balancer
    counts it in flight on from ``send`` to ``finished``."""

    def __init__(self, grant: KeyGrant, route: Route, request_id: str) -> None:
        self.grant = grant
        self.route = route
        self.request_id = request_id
        self._tried: set[int] = set()
        self._sent_to: int | None = None  # the deployment counted with this request

    def send(self) -> None:
        """The request goes to ``route``: tried there, and counted in flight on it (and
        no longer on the one before)."""
        self._tried.add(self.route.deployment_id)
        if self._sent_to is not None:
            routes.balancer.finished(self._sent_to)
        self._sent_to = self.route.deployment_id
        routes.balancer.started(self.route.deployment_id)

    def finished(self) -> None:
        """The request is no longer in flight."""
        if self._sent_to is not None:
            routes.balancer.finished(self._sent_to)

    async def other_replica(self) -> Route | None:
        """Another routable replica of the request's model, not tried yet, while this
        request may be tried again (``MAX_ATTEMPTS``)."""
        if len(self._tried) >= MAX_ATTEMPTS:
            return None
        try:
            return await routes.choose(self.grant, self.route.model_name, exclude=self._tried)
        except ApiError:
            return None

    async def fail_over(self, why: object) -> bool:
        """Nothing reached the client yet: cool the replica that failed and move to
        another routable one of the model, once (``MAX_ATTEMPTS``); False when there is
        none to try."""
        failed = self.route
        routes.balancer.cool_down(failed.deployment_id)
        route = await self.other_replica()
        if route is None:
            return False
        log.warning(
            "node %r failed request %s before its first byte (%s); retrying on node %r",
            failed.node_name,
            self.request_id,
            why,
            route.node_name,
        )
        self.route = route
        return True
