"""The benchmark tenant's keys: one per run, scoped to the run's deployment; the tenant
has no SLO class of its own, so each deployment's class applies to its requests."""

from __future__ import annotations

import uuid

import pytest

from shunter.benchmarks.targets import benchmark_key_create
from shunter.gateway.auth import load_grant
from shunter.gateway.proxy import slo_header
from shunter.gateway.routes import load_routes
from shunter.platform.models import BenchmarkJob, BenchmarkRun
from tests.tenants.factories import make_deployment, slo

pytestmark = pytest.mark.django_db


def run_on(deployment_class: str) -> tuple[BenchmarkRun, str]:
    deployment = make_deployment(slo_class=slo(deployment_class))
    job = BenchmarkJob.objects.create(
        name=f"job-{uuid.uuid4().hex[:6]}", target_kind="deployment", deployment=deployment
    )
    run = BenchmarkRun.objects.create(job=job, key=uuid.uuid4())
    return run, deployment.model.name


def test_each_runs_requests_take_their_deployments_class() -> None:
    for deployment_class in ("batch", "interactive"):
        run, model = run_on(deployment_class)
        assert run.job.deployment is not None
        key, secret = benchmark_key_create(deployment=run.job.deployment, run=run)
        assert key.tenant.default_slo_class is None
        assert list(key.scopes.all()) == [run.job.deployment]
        grant = load_grant(secret)
        assert grant is not None
        (route,) = load_routes()[model]
        assert slo_header(grant, route).startswith(f"class={deployment_class},")
