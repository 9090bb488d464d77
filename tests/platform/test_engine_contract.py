"""What the control plane tells an engine and how it reads the engine's answer: model
entries with their limits, the SLO header, and drift in what ``/admin/state`` reports."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from shunter.platform.models import SloClass
from shunter.platform.services import (
    desired_body,
    desired_set,
    drifted,
    node_poll,
    served_set,
)
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
    in ``server.puts``."""

    server: Any

    def do_GET(self) -> None:
        replies = {
            "/health": {"status": "ok"},
            "/admin/state": self.server.state,
            "/v1/models": {"data": [{"id": "m", "created": 1}]},
        }
        self._reply(replies[self.path])

    def do_PUT(self) -> None:
        length = int(self.headers["Content-Length"])
        self.server.puts.append(json.loads(self.rfile.read(length)))
        self._reply({"added": [], "removed": [], "reloaded": ["m"]})

    def _reply(self, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def stub_engine() -> Iterator[Any]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), StubEngine)
    server.state, server.puts = {}, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
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
