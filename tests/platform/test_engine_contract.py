"""What the control plane tells an engine and how it reads the engine's answer: model
entries with their limits and the SLO header, read back by the engine's own parsers;
drift in what ``/admin/state`` reports; an engine rebuilding or left without models."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import cache

from shunter.engine.config import SloSpec
from shunter.engine.server.openai_api import slo_from_header
from shunter.engine.server.serve import engine_config
from shunter.engine.server.settings import EngineSettings, settings_from_dict
from shunter.platform.models import Node, SloClass
from shunter.platform.services import (
    desired_body,
    desired_set,
    drifted,
    node_poll,
    served_set,
    slo_class_create,
)
from tests.conftest import free_port
from tests.tenants.factories import make_deployment, make_model, make_node, slo

pytestmark = pytest.mark.django_db


def test_engine_entry_carries_the_limits_that_are_set() -> None:
    d = make_deployment(model=make_model(name="m"))
    entry = d.engine_entry()
    assert entry == {
        "name": "m",
        "path": "/models/m",
        "sharing": "spatial",
        "priority": 0,
        "slo": "standard",
    }
    d.kv_floor_bytes, d.kv_ceiling_bytes, d.max_context = 1 << 20, 1 << 30, 256
    body = desired_body([d])
    assert body["models"][0] == entry | {
        "kv_floor": 1 << 20,
        "kv_ceiling": 1 << 30,
        "max_context": 256,
    }
    d.kv_floor_bytes = None
    assert "kv_floor" not in d.engine_entry() and d.engine_entry()["kv_ceiling"] == 1 << 30


def test_slo_header_carries_the_vlt_weights_compactly() -> None:
    assert slo("interactive").header() == (
        "class=interactive,ttft_ms=1000,tbt_ms=50,alpha=3,beta_b=0,beta_f=0.5"
    )
    odd = SloClass(name="odd", ttft_ms=7, tbt_ms=9, alpha=0.1, beta_b=1 / 3, beta_f=2.5e-7)
    assert odd.header() == (
        "class=odd,ttft_ms=7,tbt_ms=9,alpha=0.1,beta_b=0.333333333333,beta_f=2.5e-07"
    )
    fields = dict(part.split("=") for part in odd.header().split(","))
    assert float(fields["beta_b"]) == pytest.approx(1 / 3)


def test_the_desired_body_reads_back_through_the_engines_own_parser(tmp_path: Path) -> None:
    odd = slo_class_create(
        name="odd", ttft_ms=700, tbt_ms=30, alpha=0.1, beta_b=1 / 3, beta_f=2.5e-7
    )
    node = make_node()
    rows = [
        make_deployment(
            node=node,
            model=make_model(name="m"),
            slo_class=slo("interactive"),
            priority=2,
            kv_floor_bytes=1 << 20,
            kv_ceiling_bytes=1 << 30,
            max_context=256,
        ),
        make_deployment(node=node, model=make_model(name="t"), slo_class=odd, sharing="temporal"),
    ]
    for d in rows:  # directories the engine can size, as PUT /admin/deployments does
        d.model.source_dir = str(tmp_path / d.model.name)
        (tmp_path / d.model.name).mkdir()
        (tmp_path / d.model.name / "config.json").write_text(json.dumps(d.model.config))
        d.model.save()
    body = json.loads(json.dumps(desired_body(rows)))  # as it travels
    parsed = settings_from_dict(body, "deployments")
    config = engine_config(EngineSettings(models=parsed.models, slo_classes=parsed.slo_classes))

    by_name = {m.name: m for m in parsed.models}
    tenants = {t.model: t for t in config.tenants}
    for d in rows:
        arg, tenant = by_name[d.model.name], tenants[d.model.name]
        assert (arg.path, arg.sharing, arg.priority) == (
            Path(d.model.source_dir),
            d.sharing,
            d.priority,
        )
        assert (arg.kv_floor, arg.kv_ceiling, arg.max_context) == (
            d.kv_floor_bytes,
            d.kv_ceiling_bytes,
            d.max_context,
        )
        assert (tenant.kv_floor, tenant.kv_ceiling) == (d.kv_floor_bytes or 0, d.kv_ceiling_bytes)
        assert arg.slo is not None and tenant.slo == arg.slo
        assert_same_slo(arg.slo, d.slo_class)


def test_the_slo_header_reads_back_as_its_class() -> None:
    extra = SloClass(name="odd", ttft_ms=7, tbt_ms=9, alpha=0.1, beta_b=1 / 3, beta_f=2.5e-7)
    for cls in [*SloClass.objects.all(), extra]:
        assert_same_slo(slo_from_header(cls.header(), None, {}), cls)
        # A class the engine knows by name is overridden by what the header says.
        stale = {cls.name: SloSpec(cls.name, ttft_s=99.0, tbt_s=9.0, alpha=9, beta_f=9)}
        assert_same_slo(slo_from_header(cls.header(), None, stale), cls)


def assert_same_slo(spec: SloSpec | None, cls: SloClass) -> None:
    assert spec is not None and spec.name == cls.name
    want = cls.spec()
    for field in ("ttft_s", "tbt_s", "alpha", "beta_b", "beta_f"):
        assert getattr(spec, field) == pytest.approx(getattr(want, field), rel=1e-11), field


def state(**models: dict[str, Any]) -> dict[str, Any]:
    return {"models": models}


def test_drift_compares_the_limits_an_engine_reports() -> None:
    d = make_deployment(model=make_model(name="m"), kv_ceiling_bytes=1 << 30, max_context=256)
    desired = desired_set([d])
    base = {"sharing": "spatial", "priority": 0}
    # An engine that reports no limits is no drift for them.
    assert not drifted(served_set(state(m=base)), desired)
    same = base | {"kv_floor": None, "kv_ceiling": 1 << 30, "max_context": 256}
    assert not drifted(served_set(state(m=same)), desired)
    assert not drifted(served_set(state(m=same | {"kv_ceiling": float(1 << 30)})), desired)
    for key, value in [("kv_floor", 1), ("kv_ceiling", None), ("max_context", 512)]:
        assert drifted(served_set(state(m=same | {key: value})), desired), key
    assert drifted(served_set(state(m=base | {"priority": 2})), desired)
    assert drifted(served_set(state(m=base, other=base)), desired)
    assert drifted(served_set(state()), desired)


class StubEngine(BaseHTTPRequestHandler):
    """An engine's control routes answering from ``server.state``; PUT bodies are kept
    in ``server.puts``. With ``server.slow`` set ``/health`` answers only once
    ``server.release`` is set; with ``server.cut`` it closes the connection unanswered;
    ``server.health`` is its status code."""

    server: Any

    def do_GET(self) -> None:
        self.server.gets.append(self.path)
        if self.path == "/health" and self.server.cut:
            self.close_connection = True
            return
        if self.path == "/health" and self.server.slow:
            self.server.release.wait(30)
        state = self.server.state
        if self.path == "/v1/models" and (state.get("reconciling") or state.get("error")):
            # As the engine: no model list while it has no engine loop.
            error = {"message": "The engine serves no models", "type": "service_unavailable"}
            self._reply({"error": error}, 503)
            return
        if self.path == "/health" and self.server.health != 200:
            self._reply({"status": "stalled"}, self.server.health)
            return
        replies = {
            "/health": {"status": "ok"},
            "/admin/state": state,
            "/v1/models": {"data": [{"id": "m", "created": 1}]},
        }
        self._reply(replies[self.path])

    def do_PUT(self) -> None:
        length = int(self.headers["Content-Length"])
        self.server.puts.append(json.loads(self.rfile.read(length)))
        self._reply({"added": [], "removed": [], "reloaded": ["m"]})

    def _reply(self, body: dict[str, Any], status: int = 200) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def stub_engine() -> Iterator[Any]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), StubEngine)
    server.state, server.gets, server.puts = {}, [], []
    server.slow, server.cut, server.release = False, False, threading.Event()
    server.health = 200
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def test_poll_reconciles_an_engine_serving_other_limits(stub_engine: Any) -> None:
    node = make_node(engine_url=f"http://127.0.0.1:{stub_engine.server_address[1]}")
    make_deployment(node=node, model=make_model(name="m"), max_context=256)
    served = {"sharing": "spatial", "priority": 0, "kv_floor": None, "kv_ceiling": None}
    stub_engine.state = state(m=served | {"max_context": 256})
    polled = node_poll(node=node)
    assert polled.healthy and not polled.drifted and stub_engine.puts == []

    stub_engine.state = state(m=served | {"max_context": 512})
    polled = node_poll(node=node)
    assert polled.drifted and polled.reconciled is not None and polled.reconciled.ok
    assert stub_engine.puts[0]["models"][0]["max_context"] == 256


SERVED = {"sharing": "spatial", "priority": 0, "kv_floor": None, "kv_ceiling": None}


def test_poll_keeps_the_status_of_an_engine_replacing_its_models(stub_engine: Any) -> None:
    node = make_node(engine_url=f"http://127.0.0.1:{stub_engine.server_address[1]}")
    make_deployment(node=node, model=make_model(name="m"))
    stub_engine.state = state(m=SERVED | {"max_context": None}) | {"reconciling": False}
    assert node_poll(node=node).healthy and node.status == Node.Status.HEALTHY

    # A rebuild: no models listed (503), none in the state, ``reconciling`` set.
    stub_engine.state = {"models": {}, "error": None, "reconciling": True}
    stub_engine.gets.clear()
    polled = node_poll(node=node)
    node.refresh_from_db()
    assert polled.healthy and polled.reconciling and polled.reconciled is None
    assert node.status == Node.Status.HEALTHY and node.last_error == ""
    assert node.state == stub_engine.state
    assert "/v1/models" not in stub_engine.gets and stub_engine.puts == []


def test_poll_gives_an_engine_that_serves_no_models_the_desired_set_again(
    stub_engine: Any,
) -> None:
    node = make_node(engine_url=f"http://127.0.0.1:{stub_engine.server_address[1]}")
    make_deployment(node=node, model=make_model(name="m"), kv_ceiling_bytes=1 << 30)
    failure = "loading the desired deployments failed (boom), and so did the previous ones"
    stub_engine.state = {"models": {}, "error": failure, "reconciling": False}

    lock = f"shunter:node-reconcile:{node.pk}"
    assert cache.add(lock, 1, timeout=60)  # a reconcile of the node is under way
    try:
        polled = node_poll(node=node)
    finally:
        cache.delete(lock)
    node.refresh_from_db()
    assert not polled.healthy and polled.failure == failure and polled.reconciled is None
    assert node.status == Node.Status.UNHEALTHY and failure in node.last_error
    assert stub_engine.puts == []

    polled = node_poll(node=node)
    node.refresh_from_db()
    assert polled.reconciled is not None and polled.reconciled.ok and polled.healthy
    assert node.status == Node.Status.HEALTHY and node.last_error == ""
    (put,) = stub_engine.puts
    assert put["models"][0]["name"] == "m" and put["models"][0]["kv_ceiling"] == 1 << 30


def test_one_slow_answer_keeps_the_node_and_consecutive_misses_take_it_out(
    stub_engine: Any, settings: Any
) -> None:
    settings.NODE_POLL_MISSES = 3
    node = make_node(engine_url=f"http://127.0.0.1:{stub_engine.server_address[1]}")
    make_deployment(node=node, model=make_model(name="m"))
    stub_engine.state = state(m=SERVED | {"max_context": None})
    assert node_poll(node=node).healthy and node.status == Node.Status.HEALTHY

    # One answer slower than the poll's timeout: a miss, and the node stays routable.
    stub_engine.slow = True
    try:
        polled = node_poll(node=node)
    finally:
        stub_engine.release.set()
    node.refresh_from_db()
    assert not polled.healthy and polled.missed == 1
    assert node.status == Node.Status.HEALTHY and "missed 1 of 3" in node.last_error

    # It answers again: the count starts over and the error clears.
    stub_engine.slow = False
    polled = node_poll(node=node)
    assert polled.healthy and polled.missed == 0 and node.last_error == ""

    # Three connections in a row cut unanswered: unhealthy at the third.
    stub_engine.cut = True
    for missed in (1, 2):
        polled = node_poll(node=node)
        assert polled.missed == missed and node.status == Node.Status.HEALTHY
    polled = node_poll(node=node)
    node.refresh_from_db()
    assert polled.missed == 3 and node.status == Node.Status.UNHEALTHY
    assert "unreachable" in node.last_error


def test_a_refused_connection_or_an_error_status_marks_the_node_unhealthy_at_once(
    stub_engine: Any,
) -> None:
    refused = make_node(engine_url=f"http://127.0.0.1:{free_port()}", status=Node.Status.HEALTHY)
    polled = node_poll(node=refused)
    refused.refresh_from_db()
    assert not polled.healthy and refused.status == Node.Status.UNHEALTHY

    answered = make_node(
        engine_url=f"http://127.0.0.1:{stub_engine.server_address[1]}",
        status=Node.Status.HEALTHY,
    )
    stub_engine.health = 503  # an engine that answers it is stalled (or draining)
    polled = node_poll(node=answered)
    answered.refresh_from_db()
    assert not polled.healthy and answered.status == Node.Status.UNHEALTHY
    assert "HTTP 503" in answered.last_error
