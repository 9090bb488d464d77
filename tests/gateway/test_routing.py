"""Routing between several deployments of one model: deployments on healthy nodes take
turns, a node that turns unhealthy is skipped, and with none left the client gets a 503
``engine_unavailable`` in OpenAI's format. First on the route table over real rows, then
through ``shunter web`` with its records saying which deployment served each request."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator

import pytest

from shunter.engine.api.errors import ApiError
from shunter.gateway.auth import KeyAuthenticator, KeyGrant
from shunter.gateway.db import close_db_connections, run_db
from shunter.gateway.replies import error_reply
from shunter.gateway.routes import RouteTable
from shunter.platform import services
from shunter.platform.models import Deployment, Model, Node
from shunter.tenants.services import api_key_create
from tests.gateway.conftest import DB, LlamaSetup, Reply, World, wait_record
from tests.gateway.test_auth import Clock
from tests.tenants.factories import make_deployment, make_model, make_node, make_tenant
from tests.waiting import wait_for

pytestmark = DB

HEALTHY, UNHEALTHY = Node.Status.HEALTHY, Node.Status.UNHEALTHY


@pytest.fixture(autouse=True)
def _close_gateway_connections() -> Iterator[None]:
    yield
    close_db_connections()  # the test database is flushed and dropped after us


def set_status(*deployment_ids: int, status: str) -> None:
    Node.objects.filter(deployments__pk__in=deployment_ids).update(status=status)


# -- the route table over real rows -----------------------------------------------------------
class Replicas:
    """Two deployments of model ``m`` on nodes ``a`` and ``b``, a key that may use both,
    and a route table read from the database on ``clock``."""

    def __init__(self) -> None:
        model = make_model(name="m")
        self.a, self.b = (
            make_deployment(node=make_node(name=f"node-{n}", status=HEALTHY), model=model).pk
            for n in "ab"
        )
        # A deployment of another model on a third node: not a replica of m.
        other = make_deployment(node=make_node(name="node-c", status=HEALTHY))
        deployments = Deployment.objects.filter(pk__in=[self.a, self.b, other.pk])
        _, self.secret = api_key_create(
            tenant=make_tenant(*deployments), name="k", all_deployments=True
        )
        self.clock = Clock()
        self.routes = RouteTable(ttl_s=2.0, clock=self.clock)

    async def chosen(self, grant: KeyGrant, n: int) -> list[int]:
        """The deployments of ``n`` requests in a row, the table read anew first."""
        self.clock.now += self.routes.ttl_s
        return [(await self.routes.choose(grant, "m")).deployment_id for _ in range(n)]


async def test_deployments_of_one_model_take_turns_and_unhealthy_nodes_are_skipped() -> None:
    replicas = await run_db(Replicas)
    a, b = replicas.a, replicas.b
    grant = await KeyAuthenticator().authenticate(f"Bearer {replicas.secret}")

    turns = await replicas.chosen(grant, 6)
    assert sorted(turns) == [a, a, a, b, b, b]
    assert all(x != y for x, y in itertools.pairwise(turns))

    await run_db(lambda: set_status(b, status=UNHEALTHY))
    assert await replicas.chosen(grant, 4) == [a] * 4

    await run_db(lambda: set_status(a, status=UNHEALTHY))
    with pytest.raises(ApiError) as e:
        await replicas.chosen(grant, 1)
    reply = error_reply(e.value, "req-1")
    error = json.loads(reply.body)["error"]
    assert reply.status == 503 and set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["type"]) == ("engine_unavailable", "service_unavailable")
    assert "'m'" in error["message"]

    # A node whose health is not known yet is routed to; the turns come back.
    await run_db(lambda: set_status(a, status=Node.Status.UNKNOWN))
    await run_db(lambda: set_status(b, status=HEALTHY))
    assert sorted(await replicas.chosen(grant, 4)) == [a, a, b, b]


async def test_a_disabled_deployment_takes_no_turn() -> None:
    replicas = await run_db(Replicas)
    grant = await KeyAuthenticator().authenticate(f"Bearer {replicas.secret}")
    await run_db(lambda: Deployment.objects.filter(pk=replicas.a).update(enabled=False))
    assert await replicas.chosen(grant, 3) == [replicas.b] * 3


async def test_a_cordoned_node_takes_no_new_request_until_it_is_uncordoned() -> None:
    replicas = await run_db(Replicas)
    a, b = replicas.a, replicas.b
    grant = await KeyAuthenticator().authenticate(f"Bearer {replicas.secret}")
    node = await run_db(lambda: Node.objects.get(deployments__pk=a))
    await run_db(lambda: services.node_cordon(node=node))
    assert await replicas.chosen(grant, 3) == [b] * 3
    await run_db(lambda: services.node_uncordon(node=node))
    assert sorted(await replicas.chosen(grant, 4)) == [a, a, b, b]


async def test_keys_of_a_tenant_granted_a_model_reach_a_node_added_after_the_grant() -> None:
    def rows() -> tuple[Model, int, list[str]]:
        model = make_model(name="m")
        first = make_deployment(node=make_node(name="granted-a", status=HEALTHY), model=model)
        tenant = make_tenant(models=[model])
        keys = [
            api_key_create(tenant=tenant, name="all", all_deployments=True),
            api_key_create(tenant=tenant, name="m", model_scopes=[model]),
        ]
        return model, first.pk, [secret for _, secret in keys]

    model, first, secrets = await run_db(rows)
    auth, clock = KeyAuthenticator(), Clock()
    routes = RouteTable(ttl_s=2.0, clock=clock)
    grants = [await auth.authenticate(f"Bearer {secret}") for secret in secrets]
    for grant in grants:
        assert (await routes.choose(grant, "m")).deployment_id == first

    def added() -> int:
        return make_deployment(node=make_node(name="granted-b", status=HEALTHY), model=model).pk

    second = await run_db(added)
    clock.now += routes.ttl_s  # the table is read again; the grants were read before
    for grant in grants:
        assert (await routes.choose(grant, "m", exclude={first})).deployment_id == second


# -- through the gateway ------------------------------------------------------------------------
@pytest.fixture
def replicas(world: World) -> tuple[LlamaSetup, Deployment, str]:
    """Two deployments of ``llama`` on two nodes (both at the shared engine) and a key
    that may use both."""
    first = world.deployment(world.node("replica-a", world.engine.url), "llama")
    second = world.deployment(world.node("replica-b", world.engine.url), "llama")
    _, secret = world.key(world.tenant(first, second))
    return LlamaSetup(world, first), second, secret


def served_by(setup: LlamaSetup, secret: str, rid: str) -> int:
    """The deployment that served one completion (from its record)."""
    r = setup.completion(secret, rid)
    assert r.status == 200, r.body
    deployment_id = wait_record(rid).deployment_id
    assert deployment_id is not None
    return deployment_id


def until(predicate: Callable[[], bool], what: str) -> None:
    """Wait for the gateway's route table to be read again (a few seconds at most)."""
    wait_for(predicate, 30, what, interval=0.1)


@pytest.mark.slow
def test_through_the_gateway_replicas_take_turns_and_unhealthy_nodes_are_skipped(
    replicas: tuple[LlamaSetup, Deployment, str],
) -> None:
    setup, second, secret = replicas
    a, b = setup.llama.pk, second.pk
    turns = [served_by(setup, secret, f"turn-{i}") for i in range(4)]
    assert sorted(turns) == [a, a, b, b]
    assert all(x != y for x, y in itertools.pairwise(turns))

    set_status(b, status=UNHEALTHY)
    served: list[int] = []

    def skipped() -> bool:
        """Two in a row on ``a``: the table that says ``b`` is unhealthy is in use."""
        served.append(served_by(setup, secret, f"skip-{len(served)}"))
        return served[-2:] == [a, a]

    until(skipped, "the gateway to skip the unhealthy node")
    assert [served_by(setup, secret, f"only-a-{i}") for i in range(4)] == [a] * 4

    set_status(a, status=UNHEALTHY)
    replies: list[Reply] = []

    def refused() -> bool:
        replies.append(setup.completion(secret, f"none-{len(replies)}"))
        assert replies[-1].status in (200, 503), replies[-1].body
        return replies[-1].status == 503

    until(refused, "the gateway to see no healthy node")
    error = replies[-1].error  # exactly OpenAI's error body
    assert (error["code"], error["type"]) == ("engine_unavailable", "service_unavailable")
    assert replies[-1].headers["retry-after"] == "1"


@pytest.mark.slow
def test_through_the_gateway_a_model_grant_reaches_a_node_added_after_it(world: World) -> None:
    first = world.deployment(world.node("granted-a", world.engine.url), "llama")
    _, secret = world.key(world.tenant(models=[first.model]))  # all its deployments
    setup = LlamaSetup(world, first)
    assert served_by(setup, secret, "granted-0") == first.pk
    second = world.deployment(world.node("granted-b", world.engine.url), "llama")
    served: list[int] = []

    def reached() -> bool:
        served.append(served_by(setup, secret, f"granted-{len(served) + 1}"))
        return served[-1] == second.pk

    until(reached, "the gateway to route to a node added to a granted model")


async def test_a_regular_mix_of_two_models_spreads_each_over_both_nodes() -> None:
    def rows() -> tuple[dict[str, set[int]], str]:
        """Models m and m2, each deployed on nodes mix-a and mix-b; a key for all four."""
        nodes = [make_node(name=f"mix-{n}", status=HEALTHY) for n in "ab"]
        by_model: dict[str, set[int]] = {}
        for name in ("m", "m2"):
            model = make_model(name=name)
            by_model[name] = {make_deployment(node=node, model=model).pk for node in nodes}
        deployments = Deployment.objects.filter(pk__in=by_model["m"] | by_model["m2"])
        tenant = make_tenant(*deployments)
        _, secret = api_key_create(tenant=tenant, name="k", all_deployments=True)
        return by_model, secret

    by_model, secret = await run_db(rows)
    grant = await KeyAuthenticator().authenticate(f"Bearer {secret}")
    table = RouteTable()
    served: dict[str, list[int]] = {"m": [], "m2": []}
    for _ in range(10):  # m, m2, m, m2, ...: one counter for both pinned each to a node
        for model in ("m", "m2"):
            served[model].append((await table.choose(grant, model)).deployment_id)
    for model, ids in served.items():
        assert sorted(set(ids)) == sorted(by_model[model])
        assert all(ids.count(d) == 5 for d in by_model[model])
