"""Where a model's requests go: the deployments by served name, cached for a few seconds.

The table holds every deployment with its node's engine URL, token and health and its SLO
class, read in one query and kept ``ttl_s`` seconds (2 by default, counted from the start
of the read): a deployment that is disabled or a node that turns unhealthy is seen within
that bound; a deployment that a key's grant names but the table lacks (just created)
makes the table be read again. Under traffic the table is read again in the background
once it is half as old as the bound, so requests rarely wait for it; those that do share
one read. While the database is unreachable the table serves until it expires; then
requests get a 503 ``database_unavailable``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from shunter.engine.api.state import EngineState
from shunter.gateway.auth import KeyGrant, forbidden
from shunter.gateway.balancer import Balancer
from shunter.gateway.db import await_read
from shunter.gateway.errors import engine_unavailable, model_not_found
from shunter.gateway.ttl_cache import REFRESH_AT, TtlCache
from shunter.platform.models import ROUTABLE_STATUSES, ROUTES_CACHE_S

MIN_READ_S = 0.2
TABLE = "routes"  # the cache's one key


@dataclass(frozen=True)
class Route:
    """One deployment as the gateway forwards to it."""

    deployment_id: int
    model_name: str
    context_tokens: int
    enabled: bool
    node_name: str
    node_status: str
    engine_url: str
    engine_token: str
    slo_header: str  # the deployment's SLO class as ``X-Shunter-Slo``
    ttft_ms: int  # that class's TTFT target
    node_cordoned: bool = False
    # The model's requests queued and running on the node's engine, and its KV usage,
    # at the last poll (the balancer's tie-break).
    engine_load: tuple[int, float] = (0, 0.0)

    @property
    def routable(self) -> bool:
        """Whether new requests may go here: enabled, on a node that is up (or not
        polled yet) and not cordoned."""
        return self.enabled and self.node_status in ROUTABLE_STATUSES and not self.node_cordoned


def load_routes() -> dict[str, list[Route]]:
    """Every deployment by served name (database read, for the gateway's threads)."""
    from shunter.platform.models import Deployment

    table: dict[str, list[Route]] = {}
    for d in Deployment.objects.select_related("node", "model", "slo_class").order_by("pk"):
        route = Route(
            deployment_id=d.pk,
            model_name=d.model.name,
            context_tokens=d.context_tokens(),
            enabled=d.enabled,
            node_name=d.node.name,
            node_status=d.node.status,
            engine_url=d.node.engine_url.rstrip("/"),
            engine_token=d.node.engine_token(),
            slo_header=d.slo_class.header(),
            ttft_ms=d.slo_class.ttft_ms,
            node_cordoned=d.node.cordoned,
            engine_load=engine_load(d.node.state, d.model.name),
        )
        table.setdefault(route.model_name, []).append(route)
    return table


def engine_load(state: Any, model: str) -> tuple[int, float]:
    """``model``'s requests waiting and running, and its KV usage, as an engine's
    ``/admin/state`` reported them; zeros for what it did not report."""
    info = EngineState.parse(state).models.get(model)
    if info is None:
        return (0, 0.0)
    return (info.requests.waiting + info.requests.running, info.kv_usage)


class RouteTable:
    """The cached deployment table and the choice of a deployment for a request."""

    def __init__(
        self,
        *,
        ttl_s: float = ROUTES_CACHE_S,
        load: Callable[[], dict[str, list[Route]]] = load_routes,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self._load = load
        self._clock = clock
        self._cache: TtlCache[str, dict[str, list[Route]]] = TtlCache(ttl_s=ttl_s, clock=clock)
        # The deployment ids of the table last looked at, computed once per table.
        self._ids: tuple[dict[str, list[Route]], frozenset[int]] = ({}, frozenset())
        self.balancer = Balancer(clock=clock)

    async def table(self, grant: KeyGrant | None = None) -> dict[str, list[Route]]:
        """The table, read again when it is older than ``ttl_s``, or when ``grant`` names
        a deployment it does not hold (a new one: seen at once, at most one read per
        ``MIN_READ_S``); from ``REFRESH_AT`` of ``ttl_s`` on, read again in the
        background while this one is used."""
        now = self._clock()
        read_at, table = self._cache.entry(TABLE) or (-float("inf"), {})
        age = now - read_at
        unknown = grant is not None and not grant.deployment_ids <= self._ids_of(table)
        if age >= self.ttl_s or (unknown and age >= MIN_READ_S):
            # A read started this recently serves as well as a new one would.
            recent = MIN_READ_S if unknown else self.ttl_s
            table = await await_read(self._cache.read(TABLE, self._load, now, after=now - recent))
            newest = self._cache.entry(TABLE)
            return newest[1] if newest is not None else table
        if age >= REFRESH_AT * self.ttl_s:
            self._cache.read(TABLE, self._load, now, after=read_at)
        return table

    def _ids_of(self, table: dict[str, list[Route]]) -> frozenset[int]:
        if self._ids[0] is not table:
            self._ids = (table, frozenset(r.deployment_id for rs in table.values() for r in rs))
        return self._ids[1]

    def reading(self) -> bool:
        """Whether a read of the table is in flight."""
        return self._cache.reading()

    async def allowed(self, grant: KeyGrant) -> list[Route]:
        """The enabled deployments ``grant`` may use, by served name then id."""
        table = await self.table(grant)
        return [
            route
            for name in sorted(table)
            for route in table[name]
            if route.enabled and grant.may_use(route.deployment_id, route.model_name)
        ]

    async def choose(self, grant: KeyGrant, model: str, exclude: Collection[int] = ()) -> Route:
        """A deployment of ``model`` for ``grant``: 404 ``model_not_found`` when no
        deployment serves that name, 403 when none is the key's, 503
        ``engine_unavailable`` when the key's are disabled, on unhealthy or cordoned
        nodes or ``exclude``d (tried already). Among several routable deployments the
        ``balancer`` picks the one with the fewest requests in flight, not cooling."""
        routes = (await self.table(grant)).get(model)
        if not routes:
            raise model_not_found(model)
        mine = [r for r in routes if grant.may_use(r.deployment_id, r.model_name)]
        if not mine:
            raise forbidden(f"This API key may not use the model {model!r}.", "model_not_allowed")
        route = self.balancer.pick([r for r in mine if r.routable], exclude)
        if route is None:
            raise engine_unavailable(f"No deployment of {model!r} is serving right now.")
        return route


routes = RouteTable()
