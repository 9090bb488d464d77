"""Failover in the gateway: a request whose replica fails before any byte reached the
client (connection refused, the engine draining, the engine hung) is served by another
replica of its model, and the failed one is cooled at once, before any poll marks its
node down. A change of one node's deployments under load (cordon, drain, change,
uncordon) fails no request."""

from __future__ import annotations

import os
import re
import signal
import socketserver
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from shunter.gateway.routes import load_routes
from shunter.gateway.upstream import HEALTH_PROBE_S, first_byte_s
from shunter.platform import services, tasks
from shunter.platform.models import ROUTES_CACHE_S, Deployment, Model, Node
from shunter.platform.services import changes
from shunter.tenants.models import RequestRecord
from tests.conftest import free_port
from tests.gateway.conftest import (
    DB,
    ENGINE_TOKEN,
    Engine,
    LlamaSetup,
    World,
    bearer,
    call,
    wait_record,
)
from tests.waiting import wait_for

pytestmark = [DB, pytest.mark.slow]

# How long a change of a node's deployments takes in the rolling test, and the most a
# loaded gateway takes from a request's arrival to choosing its replica.
CHANGE_S = 2.0
ROUTE_LAG_S = 0.5


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


def test_a_hung_engine_hands_its_requests_to_another_replica_within_its_first_byte_bound(
    world: World, model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    hung = Engine({"llama": model_dirs["tiny-llama"]}, tmp_path / "hung.log")
    os.kill(hung.proc.pid, signal.SIGSTOP)  # it accepts connections and answers nothing
    try:
        setup, failing, secret = pair(world, hung.url)
        route = next(r for r in load_routes()["llama"] if r.deployment_id == failing.pk)
        bound = first_byte_s(route) + HEALTH_PROBE_S
        for stream in (False, True):
            t0 = time.monotonic()
            for i in range(3):
                r = setup.completion(secret, f"hung-{stream}-{i}", stream=stream)
                assert r.status == 200 and (not stream or b"[DONE]" in r.body), r.body
                assert wait_record(f"hung-{stream}-{i}").deployment_id == setup.llama.pk
            # At most one of them waited on the hung engine, for the bound, not 600 s.
            assert time.monotonic() - t0 < bound + 10
        assert not Deployment.objects.get(pk=failing.pk).requests.exists()
        assert "does not answer its health probe" in world.gateway.log.read_text()

        # Alone, the request ends with a 503 after a few unanswered probes.
        _, only = world.key(world.tenant(failing))
        t0 = time.monotonic()
        refused = setup.completion(only, "hung-only")
        assert refused.status == 503 and refused.error["code"] == "engine_unavailable"
        assert time.monotonic() - t0 < settings.NODE_POLL_MISSES * bound + 10
    finally:
        os.kill(hung.proc.pid, signal.SIGCONT)
        hung.stop()


def test_a_deployment_change_on_one_node_under_load_fails_no_request(
    world: World, model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node is cordoned, drained, changed, found healthy and put back in rotation;
    while it is out of rotation no request reaches it, and the other replica serves
    every one."""
    monkeypatch.setattr(tasks.nodes_roll_out_task, "delay", lambda ids: None)  # run here
    engines = [Engine({"llama": model_dirs["tiny-llama"]}, tmp_path / f"e{i}.log") for i in (1, 2)]
    try:
        nodes = [world.node(f"rolling-{i}", e.url) for i, e in enumerate(engines)]
        first, second = (world.deployment(node, "llama") for node in nodes)
        # The directory the engines load it from (the change reloads it).
        Model.objects.filter(pk=first.model_id).update(source_dir=str(model_dirs["tiny-llama"]))
        for node in nodes:
            assert services.node_poll(node=node, on_drift="keep").healthy
        _, secret = world.key(world.tenant(first, second))
        setup = LlamaSetup(world, first)
        statuses: list[int] = []
        # The node's cordon as the watcher read it: (just before the read, just after, it).
        reads: list[tuple[float, float, str]] = []
        stop = threading.Event()

        def load(worker: int) -> None:
            n = 0
            while not stop.is_set():
                r = setup.completion(secret, f"roll-{worker}-{n}", max_tokens=4)
                statuses.append(r.status)
                n += 1

        def watch() -> None:
            while not stop.is_set():
                before = time.time()
                now = Node.objects.get(pk=nodes[0].pk).cordon
                reads.append((before, time.time(), now))
                time.sleep(0.02)
            connection.close()

        threads = [threading.Thread(target=load, args=(w,)) for w in range(3)]
        threads.append(threading.Thread(target=watch))
        for t in threads:
            t.start()
        # The change takes a while, as reloading a real model does, so that the node is
        # out of rotation long enough for the load to show where it goes meanwhile.
        healthy_after_change = changes._healthy_after_change

        def slow_change(node: Node) -> bool:
            time.sleep(CHANGE_S)
            return healthy_after_change(node)

        monkeypatch.setattr(changes, "_healthy_after_change", slow_change)
        try:
            time.sleep(2)
            services.deployment_update(deployment=first, priority=3)
            [changed] = services.node_roll_out(node_ids=[nodes[0].pk])
            time.sleep(4)  # back in rotation: it takes requests again
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert changed is not None and changed.reconciled.ok, changed
        assert changed.cordoned and changed.drained and changed.healthy, changed
        assert Node.objects.get(pk=nodes[0].pk).cordon == Node.Cordon.NONE
        state = services.engine_client(nodes[0]).state()
        assert state["models"]["llama"]["priority"] == 3
        assert statuses and set(statuses) == {200}, statuses
        # Out of rotation (once the gateway read its table again) it took no request. The
        # cordon was set before the end of the first read that saw it and lifted after the
        # start of the last; a request is stamped on arrival at the gateway, which routes
        # it up to ROUTE_LAG_S later.
        cordoned = [i for i, (*_, now) in enumerate(reads) if now != Node.Cordon.NONE]
        assert cordoned and {now for *_, now in reads} == {Node.Cordon.NONE, Node.Cordon.ROLLOUT}
        first_read, last_read = reads[cordoned[0]], reads[cordoned[-1]]
        out = (first_read[1] + services.ROUTES_SETTLE_S, last_read[0] - ROUTE_LAG_S)
        assert out[1] - out[0] > CHANGE_S / 2, (out, first_read, last_read)
        records = RequestRecord.objects.filter(request_id__startswith="roll-")
        wait_for(lambda: records.count() == len(statuses), 30, "the records of the load")

        def arrivals(deployment: Deployment) -> list[float]:
            return [r.t_arrival.timestamp() for r in records.filter(deployment=deployment)]

        assert not [t for t in arrivals(first) if out[0] < t < out[1]], (out, arrivals(first))
        assert [t for t in arrivals(second) if out[0] < t < out[1]]  # the other one served
        # Back in rotation: lifted before the end of the first read that saw it lifted.
        lifted_at = reads[cordoned[-1] + 1][1]
        assert [t for t in arrivals(first) if t > lifted_at + ROUTE_LAG_S + ROUTES_CACHE_S]
    finally:
        for e in engines:
            e.stop()


class CutStreams(socketserver.ThreadingTCPServer):
    """An 'engine' that answers every request with the head of an event stream and
    then closes the connection: it fails after its head, before any event."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), CutStreamHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class CutStreamHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        length = 0
        while (line := self.rfile.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        self.rfile.read(length)
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")


def test_a_stream_whose_engine_fails_after_its_head_and_before_its_first_event_is_failed_over(
    world: World,
) -> None:
    cut = CutStreams()
    try:
        setup, _, secret = pair(world, cut.url)
        for i in range(4):
            r = setup.completion(secret, f"cut-{i}", stream=True)
            assert r.status == 200 and b"[DONE]" in r.body and b'"error"' not in r.body, r.body
            assert wait_record(f"cut-{i}").deployment_id == setup.llama.pk
        assert "failed request cut-" in world.gateway.log.read_text()
    finally:
        cut.shutdown()
        cut.server_close()
