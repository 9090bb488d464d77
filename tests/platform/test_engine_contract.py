"""What the control plane tells an engine and how it reads the engine's answer: model
entries with their limits and the SLO header, read back by the engine's own parsers;
drift in what ``/admin/state`` reports; an engine changing its models, slow or gone.

Every ``/admin/state`` here is a real engine's: a server on a tiny model in this process,
reached directly or through a relay that can stall or cut its answers. The readers of
that state (the node poll, the console's node view and memory map) are given it as a
``Tracked`` object that notes every key they ask for; a key the engine does not report
fails the test, so a change of the engine's schema that the readers do not follow
cannot pass unseen."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from shunter.console.memory_map import memory_map
from shunter.console.selectors import node_view
from shunter.engine.api.headers import slo_from_header
from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.engine.config import SloSpec
from shunter.engine.server.background import BackgroundServer
from shunter.engine.server.models import ModelArg
from shunter.engine.server.serve import build_state, engine_config
from shunter.engine.server.settings import EngineSettings, settings_from_dict
from shunter.platform import engine_client
from shunter.platform.models import Deployment, Node, SloClass
from shunter.platform.services import (
    LIMIT_KEYS,
    desired_body,
    desired_set,
    drifted,
    node_poll,
    served_set,
    slo_class_create,
)
from tests.conftest import free_port
from tests.console.states import engine_like_state
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
        "share_prefixes": False,
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


# -- a real engine and what its readers ask of its state -------------------------------------
TOKEN = "contract-token"
# Keys that hold data, not schema (model names, page owners): a reader may ask for one
# that is not there.
OPEN_MAPS = {"state.models", "state.arena.pages_by_owner"}


class Tracked(dict[str, Any]):
    """A JSON object (nested ones tracked too) that notes in ``asked`` each key a reader
    asks it for (``get``, ``[]``, ``in``) at its path, and whether it was there."""

    def __init__(
        self, value: dict[str, Any], asked: list[tuple[str, str, bool]], path: str
    ) -> None:
        super().__init__(
            {
                k: Tracked(v, asked, f"{path}.{k}") if isinstance(v, dict) else v
                for k, v in value.items()
            }
        )
        self.asked, self.path = asked, path

    def _note(self, key: object) -> None:
        self.asked.append((self.path, str(key), dict.__contains__(self, key)))

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self._note(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return super().__contains__(key)


class Readers:
    """Every ``/admin/state`` the control plane reads, as a ``Tracked`` object."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, bool]] = []

    def track(self, state: dict[str, Any]) -> Tracked:
        return Tracked(state, self.asked, "state")

    def missing(self) -> set[tuple[str, str]]:
        """The keys asked for that the engine did not report (``models.<name>`` paths
        shown as ``models.*``)."""
        return {
            (_schema_path(path), key)
            for path, key, present in self.asked
            if not present and path not in OPEN_MAPS
        }

    def paths(self) -> set[str]:
        return {_schema_path(path) for path, _, _ in self.asked}


def _schema_path(path: str) -> str:
    """``path`` with a model's name as ``*``: ``state.models.m.requests`` is
    ``state.models.*.requests``."""
    parts = path.split(".")
    if parts[:2] == ["state", "models"] and len(parts) > 2:
        parts[2] = "*"
    return ".".join(parts)


@pytest.fixture
def readers(monkeypatch: pytest.MonkeyPatch) -> Readers:
    """The node poll's reads of ``/admin/state``, tracked (the engine is still called)."""
    readers = Readers()
    real = engine_client.EngineClient.state
    monkeypatch.setattr(
        engine_client.EngineClient, "state", lambda client: readers.track(real(client))
    )
    return readers


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("contract-model")
    return init_model_dir(root / "m", config=preset_config("tiny-llama"), seed=0)


@pytest.fixture
def engine(model_dir: Path) -> Iterator[BackgroundServer]:
    """A real engine serving ``m`` (spatial, ``max_context`` 512), with a token."""
    torch.set_num_threads(1)
    settings = EngineSettings(
        models=(ModelArg("m", model_dir, "spatial", max_context=512),), kv_tokens=2048
    )
    server = BackgroundServer(build_state(settings, torch.device("cpu"), token=TOKEN))
    yield server
    server.close()


def get_json(url: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def engine_node(url: str, model_dir: Path, **fields: Any) -> tuple[Node, Deployment]:
    """A node at ``url`` with the engine's token, and a deployment of its model ``m``
    (its directory the engine's) with ``fields``."""
    node = make_node(status=Node.Status.HEALTHY)
    node.engine_url = url
    node.set_engine_token(TOKEN)
    node.save()
    model = make_model(name="m")
    model.source_dir = str(model_dir)
    model.save()
    return node, make_deployment(node=node, model=model, **fields)


def served_max_context(engine: BackgroundServer) -> Any:
    return get_json(engine.url + "/admin/state")["models"]["m"]["max_context"]


def test_the_control_plane_reads_only_what_an_engines_state_holds(
    engine: BackgroundServer, model_dir: Path, readers: Readers
) -> None:
    node, _ = engine_node(engine.url, model_dir, max_context=256)
    # The engine serves another max_context: the poll sees the drift and reconciles.
    polled = node_poll(node=node)
    assert polled.healthy and polled.drifted
    assert polled.reconciled is not None and polled.reconciled.ok
    assert served_max_context(engine) == 256
    polled = node_poll(node=node)
    assert polled.healthy and not polled.drifted and polled.reconciled is None

    # The console reads the state the poll kept.
    node = Node.objects.prefetch_related("deployments__model").get(pk=node.pk)
    node.state = readers.track(node.state)
    view = node_view(node)
    (m,) = view["models"]
    assert (m["name"], m["sharing"], m["priority"], m["active"]) == ("m", "spatial", 0, True)
    assert m["kv_blocks_total"] > 0 and m["kv_blocks_used"] == 0 and m["running"] == 0
    assert view["has_state"] and view["counters"]["steps"] >= 0
    layout = memory_map(node.state, {})
    kinds = {(s.kind, s.model) for s in layout.segments}
    assert {("weights", "m"), ("free", None), ("host_weights", "m")} <= kinds
    assert layout.hbm_bytes == node.state["arena"]["num_pages"] * node.state["arena"]["page_bytes"]

    assert readers.missing() == set(), "the readers ask for keys the engine does not report"
    # What the readers rely on was asked for, so a key renamed in the engine fails above.
    assert {"state", "state.models.*", "state.arena", "state.host_swap"} <= readers.paths()
    asked = {(_schema_path(p), k) for p, k, _ in readers.asked}
    assert {("state.models.*", key) for key in LIMIT_KEYS} <= asked


def shape(value: Any, path: str = "state") -> set[str]:
    """The key paths of a JSON value, data keys (``OPEN_MAPS``) as ``*``."""
    if not isinstance(value, dict):
        return set()
    keys: set[str] = set()
    for key, item in value.items():
        child = f"{path}.{'*' if path in OPEN_MAPS else key}"
        keys |= {child} | shape(item, child)
    return keys


def test_the_consoles_sample_state_is_an_engines(
    engine: BackgroundServer, model_dir: Path, readers: Readers
) -> None:
    """The console's tests draw a hand-made state (``tests.console.states``): it holds
    no key a real engine does not report, and every key the console reads."""
    real = get_json(engine.url + "/admin/state")
    node, _ = engine_node(engine.url, model_dir)
    node.state = readers.track(real)
    node_view(node)
    memory_map(node.state, {})
    sample = shape(engine_like_state())
    assert sample - shape(real) == set()
    read = {
        f"{_schema_path(path)}.{key}"
        for path, key, _ in readers.asked
        if _schema_path(path) not in OPEN_MAPS
    }
    assert "state.models.*.kv_blocks_total" in read and "state.arena.page_bytes" in read
    assert read - sample == set()


def test_drift_compares_the_limits_an_engine_reports(
    engine: BackgroundServer, model_dir: Path
) -> None:
    _, d = engine_node(engine.url, model_dir, kv_ceiling_bytes=1 << 30, max_context=512)
    desired = desired_set([d])
    state = get_json(engine.url + "/admin/state")
    reported = state["models"]["m"]
    assert set(LIMIT_KEYS) <= set(reported)
    # What the engine serves (no KV ceiling) is drift from the ceiling desired.
    assert drifted(served_set(state), desired)
    same = reported | {"kv_ceiling": 1 << 30}
    assert not drifted(served_set({"models": {"m": same}}), desired)
    # JSON may carry an integer as a float.
    as_float = same | {"kv_ceiling": float(1 << 30)}
    assert not drifted(served_set({"models": {"m": as_float}}), desired)
    for key, value in [("kv_floor", 1), ("kv_ceiling", None), ("max_context", 256)]:
        assert drifted(served_set({"models": {"m": same | {key: value}}}), desired), key
    assert drifted(served_set({"models": {"m": same | {"priority": 2}}}), desired)
    assert drifted(served_set({"models": {"m": same, "other": same}}), desired)
    assert drifted(served_set({"models": {}}), desired)
    # An engine that reports no limits is no drift for them.
    bare = {k: v for k, v in same.items() if k not in LIMIT_KEYS} | {"priority": 0}
    assert not drifted(served_set({"models": {"m": bare}}), desired)


def test_poll_keeps_the_status_of_an_engine_changing_its_models(
    engine: BackgroundServer, model_dir: Path, readers: Readers
) -> None:
    node, _ = engine_node(engine.url, model_dir, max_context=256)
    lock = engine.state.reconcile_lock
    engine.run(lock.acquire())  # a change of the engine's models is under way
    try:
        polled = node_poll(node=node)
    finally:
        engine.loop.call_soon_threadsafe(lock.release)
    node.refresh_from_db()
    assert polled.healthy and polled.reconciling and polled.reconciled is None
    assert node.status == Node.Status.HEALTHY and node.last_error == ""
    assert node.state["reconciling"] is True and "m" in node.state["models"]
    assert served_max_context(engine) == 512  # not reconciled meanwhile

    polled = node_poll(node=node)
    assert polled.reconciled is not None and polled.reconciled.ok
    assert served_max_context(engine) == 256
    assert readers.missing() == set()


class EngineRelay(BaseHTTPRequestHandler):
    """Relays requests to the engine at ``server.engine_url``, answers included. With
    ``server.slow`` set ``/health`` answers only once ``server.release`` is set; with
    ``server.cut`` the connection of ``/health`` is closed unanswered."""

    server: Any

    def do_GET(self) -> None:
        if self.path == "/health" and self.server.cut:
            self.close_connection = True
            return
        if self.path == "/health" and self.server.slow:
            self.server.release.wait(30)
        self._relay("GET", None)

    def do_PUT(self) -> None:
        self._relay("PUT", self.rfile.read(int(self.headers["Content-Length"])))

    def _relay(self, method: str, body: bytes | None) -> None:
        headers = {k: v for k, v in self.headers.items() if k in ("Authorization", "Content-Type")}
        request = urllib.request.Request(
            self.server.engine_url + self.path, data=body, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as reply:
                status, raw = reply.status, reply.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def relay(engine: BackgroundServer) -> Iterator[Any]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), EngineRelay)
    server.engine_url = engine.url
    server.slow, server.cut, server.release = False, False, threading.Event()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def test_one_slow_answer_keeps_the_node_and_consecutive_misses_take_it_out(
    relay: Any, model_dir: Path, settings: Any
) -> None:
    settings.NODE_POLL_MISSES = 3
    node, _ = engine_node(relay.url, model_dir, max_context=512)
    assert node_poll(node=node).healthy and node.status == Node.Status.HEALTHY

    # One answer slower than the poll's timeout: a miss, and the node stays routable.
    relay.slow = True
    try:
        polled = node_poll(node=node)
    finally:
        relay.release.set()
    node.refresh_from_db()
    assert not polled.healthy and polled.missed == 1
    assert node.status == Node.Status.HEALTHY and "missed 1 of 3" in node.last_error

    # It answers again: the count starts over and the error clears.
    relay.slow = False
    polled = node_poll(node=node)
    assert polled.healthy and polled.missed == 0 and node.last_error == ""

    # Three connections in a row cut unanswered: unhealthy at the third.
    relay.cut = True
    for missed in (1, 2):
        polled = node_poll(node=node)
        assert polled.missed == missed and node.status == Node.Status.HEALTHY
    polled = node_poll(node=node)
    node.refresh_from_db()
    assert polled.missed == 3 and node.status == Node.Status.UNHEALTHY
    assert "unreachable" in node.last_error


def test_a_refused_connection_or_an_error_status_marks_the_node_unhealthy_at_once(
    engine: BackgroundServer, model_dir: Path
) -> None:
    refused = make_node(engine_url=f"http://127.0.0.1:{free_port()}", status=Node.Status.HEALTHY)
    polled = node_poll(node=refused)
    refused.refresh_from_db()
    assert not polled.healthy and refused.status == Node.Status.UNHEALTHY

    answered, _ = engine_node(engine.url, model_dir, max_context=512)
    drain = urllib.request.Request(
        engine.url + "/admin/drain", method="POST", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    urllib.request.urlopen(drain, timeout=30).close()  # the engine answers 503 draining
    polled = node_poll(node=answered)
    answered.refresh_from_db()
    assert not polled.healthy and answered.status == Node.Status.UNHEALTHY
    assert "HTTP 503" in answered.last_error
