"""What a run drives: its target (lock key, label, the load generator's Target and,
for a deployment, the benchmark tenant's key), its SLOs, workload and recorded settings."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from shunter.benchmarks.lock import LOCK_MARGIN_S
from shunter.engine.loadgen.cli import SAMPLE_SHAREGPT
from shunter.engine.loadgen.client import Endpoint, Target
from shunter.engine.loadgen.report import Slo
from shunter.engine.workload.sharegpt import sharegpt_workload
from shunter.engine.workload.sources import LengthDist, SyntheticWorkload, Workload
from shunter.engine.workload.traces import trace_workload
from shunter.platform.models import BenchmarkJob, BenchmarkRun, Deployment, SloClass

BENCHMARK_TENANT = "benchmark"
Kind = BenchmarkJob.TargetKind


def target_lock_key(job: BenchmarkJob) -> str:
    """What a run of ``job`` occupies: the node whose engine it drives (directly or
    through the gateway), the external server, or (simulator) the job itself."""
    if job.target_kind == Kind.DEPLOYMENT and job.deployment is not None:
        return f"node:{job.deployment.node_id}"
    if job.target_kind == Kind.ENGINE and job.node_id is not None:
        return f"node:{job.node_id}"
    if job.target_kind == Kind.URL:
        base = job.base_url.strip().lower().rstrip("/").removesuffix("/v1")
        return f"url:{base}"
    return f"simulator:job:{job.pk}"


def target_label(job: BenchmarkJob) -> str:
    """How charts name the target (one line per target)."""
    if job.target_kind == Kind.DEPLOYMENT and job.deployment is not None:
        d = job.deployment
        return f"{d.model.name} on {d.node.name} (gateway)"
    if job.target_kind == Kind.ENGINE and job.node is not None:
        return f"{job.model_name} on {job.node.name} (engine)"
    if job.target_kind == Kind.URL:
        return f"{job.model_name} at {job.base_url}"
    sim = job.simulator
    if "scenario" in sim:
        return f"scenario {sim['scenario']} (simulated)"
    return f"{sim.get('model')} on {sim.get('hardware', 'gh200')} (simulated)"


def job_slo(job: BenchmarkJob) -> Slo:
    """The SLOs runs are scored against: explicit, the job's class, the deployment's
    class, or the engine's defaults (5 s TTFT, 100 ms TPOT)."""
    if job.ttft_slo_ms is not None and job.tpot_slo_ms is not None:
        return Slo(ttft_s=job.ttft_slo_ms / 1000, tpot_s=job.tpot_slo_ms / 1000)
    slo: SloClass | None = job.slo_class
    if slo is None and job.target_kind == Kind.DEPLOYMENT and job.deployment is not None:
        slo = job.deployment.slo_class
    if slo is None:
        return Slo()
    return Slo(ttft_s=slo.ttft_ms / 1000, tpot_s=slo.tbt_ms / 1000)


def job_config(job: BenchmarkJob) -> dict[str, Any]:
    """The job's settings as a run keeps them (no secrets)."""
    slo = job_slo(job)
    return {
        "target_kind": job.target_kind,
        "target": target_label(job),
        "deployment": job.deployment_id,
        "node": job.node_id,
        "base_url": job.base_url,
        "model_name": job.model_name,
        "endpoint": job.endpoint,
        "simulator": job.simulator,
        "workload_kind": job.workload_kind,
        "input_len": job.input_len,
        "output_len": job.output_len,
        "dataset_path": job.dataset_path,
        "burstiness": job.burstiness,
        "rates": job.rates,
        "duration_s": job.duration_s,
        "num_requests": job.num_requests,
        "max_concurrency": job.max_concurrency,
        "seed": job.seed,
        "ttft_slo_ms": slo.ttft_s * 1000,
        "tpot_slo_ms": slo.tpot_s * 1000,
        "request_timeout_s": job.request_timeout_s,
        "timeout_s": job.timeout_s,
    }


def job_workload(job: BenchmarkJob) -> Workload:
    """The job's requests for the load generator (lengths estimated, not tokenized)."""
    kind = job.workload_kind
    if kind == BenchmarkJob.WorkloadKind.SHAREGPT:
        return sharegpt_workload(job.dataset_path or SAMPLE_SHAREGPT)
    if kind == BenchmarkJob.WorkloadKind.TRACE:
        return trace_workload(job.dataset_path, seed=job.seed)
    return SyntheticWorkload(LengthDist.parse(job.input_len), LengthDist.parse(job.output_len))


@contextmanager
def run_target(job: BenchmarkJob, run: BenchmarkRun) -> Iterator[Target]:
    """The load generator's target. A deployment is reached through the gateway as the
    benchmark tenant, with a key made for this run and revoked when it ends."""
    endpoint: Endpoint = "chat" if job.endpoint == "chat" else "completions"
    if job.target_kind == Kind.ENGINE:
        if job.node is None:
            raise ValueError("The job's node no longer exists.")
        yield Target(job.node.engine_url, job.model_name, job.node.engine_token(), endpoint)
    elif job.target_kind == Kind.URL:
        yield Target(job.base_url, job.model_name, job.api_key() or None, endpoint)
    else:
        if job.deployment is None:
            raise ValueError("The job's deployment no longer exists.")
        key, secret = benchmark_key_create(deployment=job.deployment, run=run)
        try:
            yield Target(job.base_url, job.deployment.model.name, secret, endpoint)
        finally:
            from shunter.tenants.services import api_key_revoke

            api_key_revoke(api_key=key)


def benchmark_key_create(*, deployment: Deployment, run: BenchmarkRun) -> tuple[Any, str]:
    """A key of the benchmark tenant (created on first use, no quotas and no SLO class of
    its own: its requests take each deployment's) scoped to ``deployment``, expiring
    after the run's timeout; returns it and its secret."""
    from shunter.tenants.models import Tenant
    from shunter.tenants.services import api_key_create, tenant_create

    with transaction.atomic():
        tenant = Tenant.objects.select_for_update().filter(name=BENCHMARK_TENANT).first()
        if tenant is None:
            tenant = tenant_create(name=BENCHMARK_TENANT, deployments=[deployment])
        else:
            tenant.deployments.add(deployment)
        expires = timezone.now() + timedelta(seconds=run.job.timeout_s + LOCK_MARGIN_S)
        return api_key_create(
            tenant=tenant, name=f"benchmark run {run.pk}", scopes=[deployment], expires_at=expires
        )
