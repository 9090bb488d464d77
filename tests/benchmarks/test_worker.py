"""Benchmark runs executed by a real Celery worker (Redis broker, thread pool) against a
real ``shunter engine`` on tiny-llama, directly or through the gateway (the ASGI app
under uvicorn, serving TLS as production does behind its TLS termination), and fired by
a real ``celery beat`` with the database scheduler: results land in PostgreSQL and show
in the API, a deployment's run goes through the gateway as the benchmark tenant with a
key of its own that ends revoked, a second run on the same target waits for the first,
cancel stops a running load test, beat starts runs.

The worker and beat consume a queue of this module's own, so no other worker on the
same Redis takes these runs, and these processes take no one else's tasks.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.conf import settings
from django.db import connection
from django_celery_beat.models import PeriodicTask

from shunter.benchmarks.services import (
    benchmark_job_create,
    benchmark_job_update,
    benchmark_run_start,
)
from shunter.benchmarks.stopwatch import STOP_POLL_S
from shunter.benchmarks.targets import BENCHMARK_TENANT
from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.platform.models import BenchmarkJob, BenchmarkRun, Deployment, Model, Node, SloClass
from shunter.tenants.models import ApiKey, RequestRecord
from tests import waiting
from tests.conftest import VENV_BIN, free_port
from tests.gateway.conftest import ENGINE_TOKEN, Engine, Process, wait_database_quiet
from tests.platform.api.crud import staff_client

REDIS_URL = os.environ.get("REDIS_URL", "")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not REDIS_URL, reason="REDIS_URL is not set (make test sets it)"),
    pytest.mark.django_db(transaction=True, serialized_rollback=True),
]
QUEUE = f"test-benchmarks-{uuid.uuid4().hex[:8]}"


def process_env() -> dict[str, str]:
    """The environment of a worker or beat on the test database and Redis."""
    db = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "DJANGO_SETTINGS_MODULE"}}
    env.update(
        DATABASE_URL=(
            f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        ),
        REDIS_URL=REDIS_URL,
        SECRET_KEY=settings.SECRET_KEY,  # engine tokens are encrypted with it
        SHUNTER_VAR_DIR=str(settings.VAR_DIR),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
    )
    return env


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    root = tmp_path_factory.mktemp("bench-models")
    llama = init_model_dir(root / "tiny-llama", config=preset_config("tiny-llama"), seed=0)
    e = Engine({"llama": llama}, root / "engine.log")
    yield e
    e.stop()


@dataclass(frozen=True)
class Tls:
    """A self-signed certificate for 127.0.0.1 and its key (PEM files)."""

    cert: Path
    key: Path

    @classmethod
    def make(cls, directory: Path) -> Tls:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
        now = datetime.now(UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        tls = cls(directory / "cert.pem", directory / "key.pem")
        tls.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        tls.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return tls


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return Tls.make(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def worker(
    django_db_setup: None, tls: Tls, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Process]:
    name = f"{QUEUE}@localhost"
    command = [str(VENV_BIN / "shunter"), "worker", "--pool", "threads", "--concurrency", "4"]
    command += ["--queues", QUEUE, "--hostname", name, "--without-gossip", "--without-mingle"]
    env = {**process_env(), "SSL_CERT_FILE": str(tls.cert)}  # it trusts the gateway's
    w = Process(command, env, tmp_path_factory.mktemp("worker") / "worker.log")
    deadline = time.monotonic() + 60
    while "ready" not in w.output():
        assert w.proc.poll() is None, w.output()
        assert time.monotonic() < deadline, w.output()
        time.sleep(0.2)
    yield w
    w.stop()


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, log: Process | None = None
) -> Any:
    """``waiting.wait_for`` with the tail of ``log``'s output when it times out."""
    detail = None if log is None else (lambda: log.output()[-3000:])
    return waiting.wait_for(predicate, timeout, what, interval=0.1, detail=detail)


def run_status(run: BenchmarkRun) -> str:
    run.refresh_from_db()
    return run.status


def engine_job(engine: Engine, name: str, **fields: Any) -> BenchmarkJob:
    node = Node(name=f"node-{name}", engine_url=engine.url, hbm_bytes=8 * 1024**3)
    node.set_engine_token(ENGINE_TOKEN)
    node.save()
    return job_on(node, name, **fields)


# The load of the measured jobs here: two rates of six short requests, SLOs that CPU meets.
LOAD: dict[str, Any] = {
    "input_len": "16",
    "output_len": "8",
    "rates": [4.0, 8.0],
    "num_requests": 6,
    "ttft_slo_ms": 30_000.0,
    "tpot_slo_ms": 5_000.0,
    "request_timeout_s": 60.0,
}


def job_on(node: Node, name: str, **fields: Any) -> BenchmarkJob:
    """An engine job on ``node``'s ``llama`` with ``LOAD`` (``fields`` override)."""
    values = {"target_kind": "engine", "node": node, "model_name": "llama", **LOAD, **fields}
    return benchmark_job_create(name=name, **values)


def test_a_run_against_the_engine_lands_in_postgres_and_the_api(
    engine: Engine, worker: Process
) -> None:
    job = engine_job(engine, "engine-run")
    run = benchmark_run_start(job=job, queue=QUEUE)
    wait_for(lambda: run_status(run) in BenchmarkRun.FINISHED, 120, "the run", worker)
    assert run.status == "succeeded", run.error
    assert run.started_at is not None and run.finished_at is not None
    assert [r["request_rate"] for r in run.results] == [4.0, 8.0]
    for row in run.results:
        assert row["series"] == "llama on node-engine-run (engine)"
        assert row["completed"] == 6 and row["failed"] == 0
        assert row["total_output_tokens"] == 6 * 8
        assert 0 < row["mean_ttft_ms"] <= row["p99_ttft_ms"]
        assert row["slo_attainment"] == 1.0 and row["request_goodput"] > 0
    rows = Path(run.requests_csv).read_text().splitlines()
    assert len(rows) == 1 + 12 and rows[0].startswith("series,request_rate,index")

    api = staff_client()
    body = api.get(f"/api/benchmark-runs/{run.pk}/").json()
    assert body["status"] == "succeeded" and body["results"] == run.results
    assert body["simulated"] is False and body["has_requests_csv"] is True
    listed = api.get("/api/benchmark-runs/", {"job": job.pk}).json()["results"]
    assert [r["id"] for r in listed] == [run.pk]
    export = api.get(f"/api/benchmark-runs/{run.pk}/export/")
    assert export.json()["label"] == "MEASURED" and export.json()["results"] == run.results
    csv = api.get(f"/api/benchmark-runs/{run.pk}/requests/")
    assert csv["Content-Type"] == "text/csv"
    assert b"".join(csv.streaming_content).decode().splitlines() == rows


def test_a_second_run_on_the_same_target_waits_for_the_lock(
    engine: Engine, worker: Process
) -> None:
    first_job = engine_job(engine, "lock-a", rates=[2.0], num_requests=8, output_len="24")
    node = Node.objects.get(name="node-lock-a")
    second_job = job_on(node, "lock-b", rates=[4.0], num_requests=4)
    first = benchmark_run_start(job=first_job, queue=QUEUE)
    second = benchmark_run_start(job=second_job, queue=QUEUE)
    # The worker may take either up first (four threads take tasks at once): whichever
    # holds the node, the other waits for it.
    runs = (first, second)
    holder = wait_for(
        lambda: next((r for r in runs if run_status(r) == "running"), None),
        60,
        "a run to start",
        worker,
    )
    waiter = second if holder is first else first
    for _ in range(10):
        # Read the waiter first: if the holder is still running afterwards, it was
        # running when the waiter was read, so the waiter must have been waiting.
        waiter_status = run_status(waiter)
        if run_status(holder) != "running":
            break
        assert waiter_status == "queued"
        time.sleep(0.2)
    for run in (holder, waiter):
        wait_for(lambda r=run: run_status(r) in BenchmarkRun.FINISHED, 180, "the runs", worker)
        run.refresh_from_db()
    assert holder.status == waiter.status == "succeeded", (holder.error, waiter.error)
    assert holder.finished_at is not None and waiter.started_at is not None
    assert waiter.started_at >= holder.finished_at
    assert "retry" in worker.output().lower()


def test_cancel_stops_a_running_load_test_promptly(engine: Engine, worker: Process) -> None:
    job = engine_job(engine, "cancel", rates=[2.0], num_requests=None, duration_s=300.0)
    queued = time.monotonic()
    run = benchmark_run_start(job=job, queue=QUEUE)
    wait_for(lambda: run_status(run) == "running", 60, "the run to start", worker)
    # How long the worker took to take the run up: the baseline for how long it may take
    # to act on the cancel (both are a poll of the database and a few writes).
    started_s = time.monotonic() - queued
    wait_for(lambda: engine.live_requests() > 0, 60, "requests in flight", worker)
    api = staff_client()
    assert api.post(f"/api/benchmark-runs/{run.pk}/cancel/").status_code == 200
    asked = time.monotonic()
    wait_for(lambda: run_status(run) == "cancelled", 60, "the cancel", worker)
    cancel_s = time.monotonic() - asked
    assert cancel_s < max(4 * started_s, 10 * STOP_POLL_S)
    # The worker stopped it (the service ends only a run no worker executes).
    assert run.error == "Cancelled." and run.finished_at is not None
    # The engine's streams were closed: it aborts their requests.
    wait_for(lambda: engine.live_requests() == 0, 20, "the engine to drop the requests")
    # The target is free again: the next run starts.
    again = benchmark_run_start(job=job, queue=QUEUE)
    wait_for(lambda: run_status(again) == "running", 30, "a new run", worker)
    assert api.post(f"/api/benchmark-runs/{again.pk}/cancel/").status_code == 200
    wait_for(lambda: run_status(again) == "cancelled", 10, "the second cancel", worker)


def test_beat_fires_a_scheduled_simulator_job(
    worker: Process, tmp_path_factory: pytest.TempPathFactory
) -> None:
    job = benchmark_job_create(
        name="scheduled-sim",
        target_kind="simulator",
        simulator={"model": "qwen2.5-7b", "hardware": "h100", "policies": ["lvf", "fcfs"]},
        rates=[2.0],
        duration_s=5.0,
        input_len="64..256",
        output_len="32..128",
        schedule_every_s=1,
    )
    task = PeriodicTask.objects.get(pk=job.periodic_task_id)
    assert task.task == "shunter.platform.benchmark_job_fire" and task.interval.every == 1
    task.queue = QUEUE  # what an operator may set in the admin: the services keep it
    task.save()
    log = tmp_path_factory.mktemp("beat") / "beat.log"
    beat = Process([str(VENV_BIN / "shunter"), "beat"], process_env(), log)
    try:
        run = wait_for(
            lambda: BenchmarkRun.objects.filter(job=job, trigger="schedule").first(),
            60,
            "a scheduled run",
            beat,
        )
        wait_for(lambda: run_status(run) in BenchmarkRun.FINISHED, 60, "the run", worker)
    finally:
        beat.stop()
    assert run.status == "succeeded", run.error
    assert run.simulated and run.target_label == "qwen2.5-7b on h100 (simulated)"
    assert [r["series"] for r in run.results] == ["lvf", "fcfs"]
    assert all(r["completed"] > 0 and r["slo_attainment"] >= 0 for r in run.results)
    assert staff_client().get(f"/api/benchmark-runs/{run.pk}/export/").json()["label"] == (
        "SIMULATED"
    )


class TlsGateway(Process):
    """The ASGI application under uvicorn with the worker's environment (production
    settings: the HTTPS redirect is on), serving TLS with ``tls``'s certificate."""

    def __init__(self, tls: Tls, log: Path) -> None:
        self.url = f"https://127.0.0.1:{free_port()}"
        port = self.url.rsplit(":", 1)[1]
        command = [str(VENV_BIN / "python"), "-m", "uvicorn", "shunter.project.asgi:application"]
        command += ["--host", "127.0.0.1", "--port", port, "--lifespan", "on"]
        command += ["--ssl-certfile", str(tls.cert), "--ssl-keyfile", str(tls.key)]
        super().__init__(command, process_env(), log)
        context = ssl.create_default_context(cafile=str(tls.cert))

        def healthy() -> bool:
            assert self.proc.poll() is None, self.output()
            try:
                with urllib.request.urlopen(self.url + "/healthz", context=context) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for(healthy, 60, "the gateway", self)


@pytest.fixture(scope="module")
def gateway(tls: Tls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsGateway]:
    g = TlsGateway(tls, tmp_path_factory.mktemp("gateway") / "gateway.log")
    yield g
    g.stop()


def deployment_on(engine: Engine, name: str, slo: str) -> Deployment:
    """A deployment of the engine's ``llama`` on a new node ``name``."""
    node = Node(name=name, engine_url=engine.url, hbm_bytes=8 * 1024**3)
    node.set_engine_token(ENGINE_TOKEN)
    node.save()
    model, _ = Model.objects.get_or_create(
        name="llama",
        defaults={
            "source_dir": "/models/llama",
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


def test_a_deployment_run_goes_through_the_gateway_as_the_benchmark_tenant(
    engine: Engine, worker: Process, gateway: TlsGateway
) -> None:
    deployment = deployment_on(engine, "node-deployment-run", "interactive")
    job = benchmark_job_create(
        name="deployment-run",
        target_kind="deployment",
        deployment=deployment,
        base_url=gateway.url,
        **LOAD,
    )
    run = benchmark_run_start(job=job, queue=QUEUE)
    wait_for(lambda: run_status(run) in BenchmarkRun.FINISHED, 120, "the run", worker)
    assert run.status == "succeeded", run.error
    assert run.lock_key == f"node:{deployment.node_id}"
    assert [r["request_rate"] for r in run.results] == [4.0, 8.0]
    for row in run.results:
        assert row["series"] == "llama on node-deployment-run (gateway)"
        assert row["completed"] == 6 and row["failed"] == 0, row["error_counts"]
        assert row["total_output_tokens"] == 6 * 8
        assert 0 < row["mean_ttft_ms"] <= row["p99_ttft_ms"]
        assert row["slo_attainment"] == 1.0 and row["request_goodput"] > 0
    assert len(Path(run.requests_csv).read_text().splitlines()) == 1 + 12
    body = staff_client().get(f"/api/benchmark-runs/{run.pk}/").json()
    assert body["status"] == "succeeded" and body["results"] == run.results
    assert body["target_label"] == "llama on node-deployment-run (gateway)"
    key = gateway_key(run, deployment, "completions", 12, gateway)

    # The next run (chat this time) finds the benchmark tenant and gets a key of its own.
    chat = benchmark_job_update(job=job, endpoint="chat", rates=[4.0])
    again = benchmark_run_start(job=chat, queue=QUEUE)
    wait_for(lambda: run_status(again) in BenchmarkRun.FINISHED, 120, "the chat run", worker)
    assert again.status == "succeeded", again.error
    (row,) = again.results
    assert row["completed"] == 6 and row["total_output_tokens"] == 6 * 8, row["error_counts"]
    assert gateway_key(again, deployment, "chat", 6, gateway).tenant_id == key.tenant_id
    wait_database_quiet()


def gateway_key(
    run: BenchmarkRun, deployment: Deployment, endpoint: str, requests: int, gateway: Process
) -> ApiKey:
    """The benchmark tenant's key of ``run``, after checking that it was scoped to
    ``deployment``, is revoked since the run ended, and that the gateway recorded each of
    the run's ``requests`` under it while it was valid."""
    assert run.started_at is not None and run.finished_at is not None
    key = ApiKey.objects.get(tenant__name=BENCHMARK_TENANT, name=f"benchmark run {run.pk}")
    assert list(key.scopes.all()) == [deployment]
    assert key.revoked_at is not None
    assert run.started_at <= key.revoked_at <= run.finished_at
    records = wait_for(
        lambda: len(r := list(RequestRecord.objects.filter(api_key=key))) == requests and r,
        30,
        "the gateway's request records",
        gateway,
    )
    for record in records:
        assert record.tenant_id == key.tenant_id and record.deployment == deployment
        assert record.status == "ok" and record.http_status == 200
        assert record.stream and record.endpoint == endpoint
        assert record.model_name == "llama" and record.completion_tokens == 8
        assert run.started_at <= record.t_arrival <= record.t_end <= key.revoked_at
    return key
