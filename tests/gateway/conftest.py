"""Real processes for the gateway's tests: ``shunter engine`` subprocesses on tiny models,
and ``shunter web`` (uvicorn, the production settings) on the test database and Redis.

The rows the gateway reads must be committed (the gateway is another process): tests
run with ``django_db(transaction=True, serialized_rollback=True)`` and make their rows
through ``world``. Every test's logs, and its processes', are checked for exceptions
(``tests.logcheck``).
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
import urllib.parse
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection

from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.platform.models import Deployment, Model, Node, SloClass
from shunter.tenants.models import ApiKey, RequestRecord, Tenant
from shunter.tenants.services import api_key_create, tenant_create
from tests.conftest import VENV_BIN, Process, free_port
from tests.logcheck import log_check, pytest_configure  # noqa: F401 (the log check)

ENGINE_TOKEN = "engine-token-for-tests"
REDIS_URL = os.environ.get("REDIS_URL", "")
# The gateway runs with production settings behind a TLS proxy; clients say so.
HTTPS = {"X-Forwarded-Proto": "https"}
DB = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if get(url, headers=HTTPS).status == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{url} did not come up:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> dict[str, Any]:
        body = self.json()
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
        return dict(body["error"])


def call(
    method: str, url: str, body: Any = None, *, headers: dict[str, str] | None = None
) -> Reply:
    """One request on a fresh connection; ``body`` is JSON unless it is bytes."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    try:
        conn.request(method, parts.path, body=data, headers={**HTTPS, **(headers or {})})
        r = conn.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def get(url: str, *, headers: dict[str, str] | None = None) -> Reply:
    return call("GET", url, headers=headers)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


class Engine(Process):
    """``shunter engine`` on CPU serving ``models`` (name -> directory), with a token;
    the models named in ``temporal`` share the device temporally, the others spatially."""

    def __init__(
        self, models: dict[str, Path], log: Path, *, temporal: Collection[str] = ()
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [str(VENV_BIN / "shunter"), "engine", "--device", "cpu"]
        command += ["--port", str(self.port), "--kv-tokens", "16384", "--grace", "1"]
        for name, path in models.items():
            sharing = "temporal" if name in temporal else "spatial"
            command += ["--model", f"{name}={path}:{sharing}"]
        env = {**os.environ, "SHUNTER_ENGINE_TOKEN": ENGINE_TOKEN, "OMP_NUM_THREADS": "1"}
        super().__init__(command, env, log)
        wait_healthy(self.url + "/health", self.proc, log)

    def live_requests(self) -> int:
        state = get(self.url + "/admin/state", headers=bearer(ENGINE_TOKEN)).json()
        return int(state["requests"]["live"])


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gateway-models")
    return {
        name: init_model_dir(root / name, config=preset_config(name), seed=0)
        for name in ("tiny-llama", "tiny-qwen2")
    }


@pytest.fixture(scope="session")
def engine(
    model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    """The shared engine: ``llama`` and ``qwen``."""
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    e = Engine({"llama": model_dirs["tiny-llama"], "qwen": model_dirs["tiny-qwen2"]}, log)
    yield e
    e.stop()


class Gateway(Process):
    """``shunter web`` on the test database (and Redis when the suite has it);
    ``overrides`` replace variables of its environment."""

    def __init__(self, log: Path, overrides: Mapping[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        db = connection.settings_dict  # the test database's (settings keep the original)
        env = {
            k: v for k, v in os.environ.items() if k not in {"DEBUG", "SHUNTER_HTTPS", "REDIS_URL"}
        }
        env.update(
            DATABASE_URL=(
                f"postgres://{quote(db['USER'])}:{quote(db['PASSWORD'] or '')}@"
                f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
            ),
            SECRET_KEY=settings.SECRET_KEY,  # the engine tokens are encrypted with it
            SHUNTER_VAR_DIR=str(settings.VAR_DIR),
            SHUNTER_LOG_LEVEL="DEBUG",
        )
        if REDIS_URL:
            env["REDIS_URL"] = REDIS_URL
        env.update(overrides or {})
        command = [str(VENV_BIN / "shunter"), "web", "--port", str(self.port)]
        super().__init__(command, env, log)
        wait_healthy(self.url + "/healthz", self.proc, log)


@pytest.fixture(scope="session")
def gateway(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = Gateway(tmp_path_factory.mktemp("gateway") / "gateway.log")
    yield g
    g.stop()


@dataclass
class World:
    """Rows of one test, committed (the test runs with ``transaction=True``: the gateway
    is another process), and the processes that serve them."""

    engine: Engine
    gateway: Gateway
    secrets: list[str] = field(default_factory=list)

    def node(self, name: str, url: str) -> Node:
        node = Node(name=name, engine_url=url, hbm_bytes=80 * 1024**3)
        node.set_engine_token(ENGINE_TOKEN)
        node.save()
        return node

    def deployment(self, node: Node, model_name: str, slo: str = "interactive") -> Deployment:
        model, _ = Model.objects.get_or_create(
            name=model_name,
            defaults={
                "source_dir": f"/models/{model_name}",
                "architecture": "llama",
                "num_layers": 2,
                "param_bytes": 1,
                "kv_bytes_per_token": 1,
                "context_length": 2048,
            },
        )
        return Deployment.objects.create(
            node=node, model=model, slo_class=SloClass.objects.get(name=slo)
        )

    def tenant(self, *deployments: Deployment, **quotas: Any) -> Tenant:
        tenant = tenant_create(
            name=f"tenant-{Tenant.objects.count()}",
            default_slo_class=SloClass.objects.get(name="standard"),
            deployments=deployments,
            **quotas,
        )
        reset_quotas(tenant)
        return tenant

    def key(self, tenant: Tenant, **fields: Any) -> tuple[ApiKey, str]:
        """A key of ``tenant``: its ``scopes`` when given, else all its deployments."""
        fields.setdefault("all_deployments", not fields.get("scopes"))
        key, secret = api_key_create(tenant=tenant, name=f"key-{len(self.secrets)}", **fields)
        self.secrets.append(secret)
        return key, secret


@pytest.fixture
def world(engine: Engine, gateway: Gateway) -> Iterator[World]:
    yield World(engine, gateway)
    wait_database_quiet()


def wait_database_quiet(quiet_s: float = 0.3, timeout: float = 15.0) -> None:
    """Wait until no other session works on the test database for ``quiet_s``: the
    gateway writes records after its responses, and the flush after a test must not
    race them. Raises when the database stays busy for ``timeout``, naming what ran."""
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    busy: list[tuple[Any, ...]] = []
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, application_name, state, left(query, 200) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND state <> 'idle'"
            )
            busy = cursor.fetchall()
        if busy:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return
        time.sleep(0.05)
    raise AssertionError(f"the test database was still busy after {timeout} s: {busy}")


def reset_quotas(tenant: Tenant) -> None:
    """Forget the tenant id's counts in Redis (ids repeat across test databases)."""
    if not REDIS_URL:
        return
    import asyncio

    from shunter.gateway.quotas import RedisQuotaLimiter

    async def reset() -> None:
        limiter = RedisQuotaLimiter(REDIS_URL)
        await limiter.reset(str(tenant.pk))
        await limiter.aclose()

    asyncio.run(reset())


def wait_record(request_id: str, timeout: float = 15.0) -> RequestRecord:
    """The RequestRecord the gateway writes after the response (polled)."""
    deadline = time.monotonic() + timeout
    while True:
        record = RequestRecord.objects.filter(request_id=request_id).first()
        if record is not None:
            return record
        assert time.monotonic() < deadline, f"no record of {request_id}"
        time.sleep(0.05)


@dataclass
class LlamaSetup:
    """A world with one llama deployment; ``completion`` calls it through the gateway
    (or the gateway at ``url``) as the holder of ``secret``."""

    world: World
    llama: Deployment

    def completion(self, secret: str, rid: str = "", url: str = "", **body: object) -> Reply:
        headers = {**bearer(secret), **({"X-Request-Id": rid} if rid else {})}
        payload = {"model": "llama", "prompt": "Hello", "max_tokens": 1, **body}
        gateway = url or self.world.gateway.url
        return call("POST", gateway + "/v1/completions", payload, headers=headers)


@pytest.fixture
def llama_setup(world: World) -> LlamaSetup:
    """The world with one llama deployment on a node of the test engine."""
    node = world.node("llama-node", world.engine.url)
    return LlamaSetup(world, world.deployment(node, "llama"))
