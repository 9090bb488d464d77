"""Reconcile and poll against a real ``shunter engine`` process on tiny models: the
seeded deployments are pushed to it, a killed engine turns the node unhealthy, a
restarted one (serving something else) is reconciled by the next poll, and so is one
left serving no models by a reload that failed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.platform.models import Deployment, Model, Node
from shunter.platform.services import node_poll, node_reconcile
from shunter.project.management.commands.seed_demo import seed_demo
from shunter.tenants.keys import secret_digest
from shunter.tenants.models import ApiKey, Tenant
from tests.conftest import VENV_BIN, free_port

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
TOKEN = "engine-t0ken"


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        name: init_model_dir(root / name, config=preset_config(name), seed=0)
        for name in ("tiny-llama", "tiny-qwen2")
    }


class Engine:
    """``shunter engine`` on a loopback port, serving ``boot`` (not a desired model)."""

    def __init__(self, port: int, boot_dir: Path) -> None:
        self.port, self.boot_dir = port, boot_dir
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                str(VENV_BIN / "shunter"),
                "engine",
                "--device",
                "cpu",
                "--port",
                str(self.port),
                "--kv-tokens",
                "4096",
                "--grace",
                "1",
                "--model",
                f"boot={self.boot_dir}",
            ],
            env={**os.environ, "SHUNTER_ENGINE_TOKEN": TOKEN},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            assert self.proc.poll() is None, "the engine exited"
            assert time.monotonic() < deadline, "the engine did not come up"
            time.sleep(0.2)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def get(self, path: str) -> Any:
        request = urllib.request.Request(
            self.url + path, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            return json.loads(r.read())

    def served(self) -> dict[str, str]:
        return {name: m["sharing"] for name, m in self.get("/admin/state")["models"].items()}


@pytest.fixture
def engine(model_dirs: dict[str, Path]) -> Iterator[Engine]:
    e = Engine(free_port(), model_dirs["tiny-qwen2"])
    e.start()
    yield e
    e.kill()


def seed(engine_url: str, model_dirs: dict[str, Path]) -> Any:
    return seed_demo(
        engine_url=engine_url,
        engine_token=TOKEN,
        llama_dir=str(model_dirs["tiny-llama"]),
        qwen_dir=str(model_dirs["tiny-qwen2"]),
        hbm_bytes=8 * 1024**3,
    )


def test_seed_demo_is_idempotent(model_dirs: dict[str, Path]) -> None:
    first = seed("http://127.0.0.1:9", model_dirs)
    assert set(first.secrets) == {"demo-chat", "demo-batch"}
    for tenant, secret in first.secrets.items():
        assert ApiKey.objects.get(digest=secret_digest(secret)).tenant.name == tenant
    chat, batch = Tenant.objects.get(name="demo-chat"), Tenant.objects.get(name="demo-batch")
    assert chat.default_slo_class.name != batch.default_slo_class.name
    assert {d.sharing for d in Deployment.objects.all()} == {"temporal", "spatial"}
    counts = [m.objects.count() for m in (Node, Model, Deployment, Tenant, ApiKey)]
    again = seed("http://127.0.0.1:9", model_dirs)
    assert again.created == [] and again.secrets == {}
    assert [m.objects.count() for m in (Node, Model, Deployment, Tenant, ApiKey)] == counts


def test_reconcile_poll_kill_and_restart(engine: Engine, model_dirs: dict[str, Path]) -> None:
    seed(engine.url, model_dirs)
    node = Node.objects.get(name="demo")
    assert engine.served() == {"boot": "spatial"}

    result = node_reconcile(node=node)
    assert result.ok, result.error
    assert result.changes is not None and result.changes["removed"] == ["boot"]
    assert engine.served() == {"tiny-llama": "temporal", "tiny-qwen2": "spatial"}

    polled = node_poll(node=node)
    node.refresh_from_db()
    assert polled.healthy and not polled.drifted and polled.reconciled is None
    assert node.status == Node.Status.HEALTHY and node.last_seen is not None
    assert set(node.state["models"]) == {"tiny-llama", "tiny-qwen2"}
    started = node.engine_started
    assert started is not None

    engine.kill()
    polled = node_poll(node=node)
    node.refresh_from_db()
    assert not polled.healthy and node.status == Node.Status.UNHEALTHY
    assert "unreachable" in node.last_error

    time.sleep(1.1)  # the engine's start time has a resolution of one second
    engine.start()
    assert engine.served() == {"boot": "spatial"}
    polled = node_poll(node=node)
    node.refresh_from_db()
    assert polled.healthy and polled.restarted and polled.drifted
    assert polled.reconciled is not None and polled.reconciled.ok
    assert engine.served() == {"tiny-llama": "temporal", "tiny-qwen2": "spatial"}
    assert node.status == Node.Status.HEALTHY and node.engine_started != started
    assert node.last_error == ""


def test_a_refused_desired_set_is_kept_as_the_nodes_error(
    engine: Engine, model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    seed(engine.url, model_dirs)
    model = Model.objects.get(name="tiny-llama")
    Model.objects.filter(pk=model.pk).update(source_dir=str(tmp_path / "moved-away"))
    node = Node.objects.get(name="demo")
    result = node_reconcile(node=node)
    node.refresh_from_db()
    assert not result.ok and "HTTP 400" in node.last_error
    assert node.status != Node.Status.UNHEALTHY  # the engine answered
    assert engine.served() == {"boot": "spatial"}  # and kept serving what it served


def test_a_wrong_token_is_reported(engine: Engine, model_dirs: dict[str, Path]) -> None:
    seed(engine.url, model_dirs)
    node = Node.objects.get(name="demo")
    node.set_engine_token("wrong")
    node.save()
    polled = node_poll(node=node)
    assert not polled.healthy and "HTTP 401" in node.last_error


def test_a_change_that_fails_to_load_keeps_the_served_set_and_the_poll_retries_it(
    model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    boot = tmp_path / "boot"
    shutil.copytree(model_dirs["tiny-qwen2"], boot)
    engine = Engine(free_port(), boot)
    engine.start()
    try:
        seed(engine.url, model_dirs)
        node = Node.objects.get(name="demo")
        # A desired set that passes the engine's checks but cannot load (no weights): the
        # change touches nothing, and the model it had goes on serving.
        broken = tmp_path / "no-weights"
        shutil.copytree(model_dirs["tiny-llama"], broken)
        (broken / "model.safetensors").unlink()
        llama = Model.objects.get(name="tiny-llama")
        Model.objects.filter(pk=llama.pk).update(source_dir=str(broken))
        assert not node_reconcile(node=node).ok
        state = engine.get("/admin/state")
        assert set(state["models"]) == {"boot"} and not state["reconciling"]
        assert engine.served() == {"boot": "spatial"}

        Model.objects.filter(pk=llama.pk).update(source_dir=llama.source_dir)
        polled = node_poll(node=node)
        node.refresh_from_db()
        assert polled.drifted and polled.reconciled is not None and polled.reconciled.ok
        assert polled.healthy and node.status == Node.Status.HEALTHY
        assert engine.served() == {"tiny-llama": "temporal", "tiny-qwen2": "spatial"}
    finally:
        engine.kill()
