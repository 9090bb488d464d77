"""Failover in the gateway: a request whose replica fails before any byte reached the
client (connection refused, the engine draining) is served by another replica of its
model, and the failed one is cooled at once, before any poll marks its node down."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shunter.platform.models import Deployment
from tests.conftest import free_port
from tests.platform.gateway.conftest import (
    DB,
    ENGINE_TOKEN,
    Engine,
    LlamaSetup,
    World,
    bearer,
    call,
    wait_record,
)

pytestmark = [DB, pytest.mark.slow]


def served_by(setup: LlamaSetup, secret: str, rid: str, **body: object) -> int:
    r = setup.completion(secret, rid, **body)
    assert r.status == 200, r.body
    deployment_id = wait_record(rid).deployment_id
    assert deployment_id is not None
    return deployment_id


def pair(world: World, failing_url: str) -> tuple[LlamaSetup, Deployment, str]:
    """``llama`` on a node at ``failing_url`` and on one at the shared engine, and a key
    that may use both."""
    failing = world.deployment(world.node("failing", failing_url), "llama")
    live = world.deployment(world.node("live", world.engine.url), "llama")
    _, secret = world.key(world.tenant(failing, live))
    return LlamaSetup(world, live), failing, secret


def test_a_replica_that_refuses_connections_is_failed_over_and_cooled(world: World) -> None:
    setup, failing, secret = pair(world, f"http://127.0.0.1:{free_port()}")
    live = setup.llama.pk
    # Both replicas are routable (the node's health is not known yet): without failover
    # every other request would be a 503.
    assert [served_by(setup, secret, f"refused-{i}") for i in range(6)] == [live] * 6
    streamed = setup.completion(secret, "refused-stream", stream=True)
    assert streamed.status == 200 and b"[DONE]" in streamed.body, streamed.body
    assert wait_record("refused-stream").deployment_id == live
    assert not Deployment.objects.get(pk=failing.pk).requests.exists()
    # Tried once (the first or second request, by the turns of equal replicas), then
    # cooled: the next requests went to the live replica without trying it first.
    log = world.gateway.log.read_text()
    assert log.count("failed request refused-") == 1, log
    assert re.search(r"failed request refused-[01] before its first byte", log), log


def test_a_draining_engine_hands_its_new_requests_to_another_replica(
    world: World, model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    draining = Engine({"llama": model_dirs["tiny-llama"]}, tmp_path / "draining.log")
    try:
        drained = call("POST", draining.url + "/admin/drain", {}, headers=bearer(ENGINE_TOKEN))
        assert drained.status == 200, drained.body
        setup, failing, secret = pair(world, draining.url)
        assert [served_by(setup, secret, f"drain-{i}") for i in range(4)] == [setup.llama.pk] * 4
        # Alone, the draining replica's 503 reaches the client as it always did.
        _, only = world.key(world.tenant(failing))
        refused = setup.completion(only, "drain-only")
        assert refused.status == 503, refused.body
        assert refused.error["code"] == "service_unavailable"
    finally:
        draining.stop()
