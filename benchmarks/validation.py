"""Validation of benchmark jobs: which fields a job has, and what each target kind,
workload and schedule needs (a ValidationError per field otherwise)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from celery.schedules import crontab
from django.conf import settings
from django.core.exceptions import ValidationError
from django_celery_beat.models import CrontabSchedule

from shunter.engine.config import POLICIES
from shunter.engine.workload.requests import WorkloadError
from shunter.engine.workload.sources import LengthDist
from shunter.platform.models import BenchmarkJob

Kind = BenchmarkJob.TargetKind

# The fields the job services take (``api_key`` apart), in the order the API lists them.
JOB_FIELDS = (
    "name",
    "description",
    "target_kind",
    "deployment",
    "node",
    "base_url",
    "model_name",
    "endpoint",
    "simulator",
    "workload_kind",
    "input_len",
    "output_len",
    "dataset_path",
    "burstiness",
    "rates",
    "duration_s",
    "num_requests",
    "max_concurrency",
    "seed",
    "slo_class",
    "ttft_slo_ms",
    "tpot_slo_ms",
    "request_timeout_s",
    "timeout_s",
    "schedule_every_s",
    "schedule_crontab",
    "enabled",
)

SWEEP_KEYS = {"model", "hardware", "policies"}
SCENARIO_KEYS = {"scenario", "sharing", "variants", "hardware", "window_s"}


def check_simulator(config: Any) -> str | None:
    """The problem with a ``simulator`` setting, or None. Either a sweep ``{"model",
    "hardware", "policies"}`` or a scenario ``{"scenario", "sharing", "variants",
    "hardware", "window_s"}`` (all but ``model`` / ``scenario`` optional)."""
    from shunter.engine.catalog import get_model
    from shunter.engine.sim.hardware import PROFILES
    from shunter.engine.sim.scenario import SHARING, VARIANTS, get_scenario

    if not isinstance(config, dict) or not config:
        return 'Give {"model": ..., "hardware": ..., "policies": [...]} or {"scenario": ...}.'
    scenario = "scenario" in config
    allowed = SCENARIO_KEYS if scenario else SWEEP_KEYS
    unknown = sorted(set(config) - allowed)
    if unknown:
        return f"Unknown keys {unknown}; allowed: {sorted(allowed)}."

    def names(key: str, choices: Any, default: list[str]) -> str | None:
        value = config.get(key, default)
        if (
            not isinstance(value, list)
            or not value
            or any(not isinstance(v, str) or v not in choices for v in value)
        ):
            return f"{key!r} must be a non-empty list of {sorted(choices)}."
        return None

    hardware = config.get("hardware", "gh200-96g" if scenario else "gh200")
    if not isinstance(hardware, str) or hardware not in PROFILES:
        return f"Unknown hardware {hardware!r}: choose one of {sorted(PROFILES)}."
    try:
        if scenario:
            get_scenario(str(config["scenario"]))
        else:
            get_model(str(config.get("model", "")))
    except ValueError as e:
        return str(e)
    if scenario:
        window = config.get("window_s", 30.0)
        if isinstance(window, bool) or not isinstance(window, int | float) or not window > 0:
            return "'window_s' must be a positive number of seconds."
        return names("sharing", SHARING, ["temporal"]) or names(
            "variants", VARIANTS, list(VARIANTS)
        )
    return names("policies", POLICIES, ["lvf"])


def _check_crontab(text: str) -> str | None:
    fields = text.split()
    if len(fields) != 5:
        return "Five fields: minute hour day-of-month month day-of-week, e.g. '0 3 * * *'."
    names = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
    for name, field in zip(names, fields, strict=True):
        if len(field) > (CrontabSchedule._meta.get_field(name).max_length or 0):
            return f"The {name.replace('_', ' ')} field is too long."
    try:
        crontab(*fields)
    except Exception as e:  # celery's parser raises several kinds for bad fields
        return f"Not a crontab: {e}"
    return None


def clean_job(job: BenchmarkJob) -> None:
    """Field validation, then what depends on several fields (per target kind)."""
    job.full_clean(exclude=["periodic_task"])
    errors: dict[str, str] = {}
    kind = job.target_kind
    if kind == Kind.DEPLOYMENT:
        if job.deployment is None:
            errors["deployment"] = "A deployment target needs the deployment."
        if not job.base_url:
            errors["base_url"] = "The gateway's base URL (e.g. https://shunter.example.com)."
        elif settings.SECURE_SSL_REDIRECT and urlsplit(job.base_url).scheme != "https":
            # The gateway answers plain HTTP with a redirect: every request would fail.
            errors["base_url"] = (
                "The gateway redirects HTTP to HTTPS (SHUNTER_HTTPS): give its https:// URL."
            )
    elif kind == Kind.ENGINE:
        if job.node is None:
            errors["node"] = "An engine target needs the node."
        if not job.model_name:
            errors["model_name"] = "The model name the engine serves."
    elif kind == Kind.URL:
        if not job.base_url:
            errors["base_url"] = "The server's OpenAI-compatible base URL."
        if not job.model_name:
            errors["model_name"] = "The model name the server serves."
    elif kind == Kind.SIMULATOR:
        problem = check_simulator(job.simulator)
        if problem:
            errors["simulator"] = problem
        if job.workload_kind == BenchmarkJob.WorkloadKind.TRACE:
            errors["workload_kind"] = "The simulator takes synthetic or ShareGPT workloads."
    for field in ("input_len", "output_len"):
        try:
            LengthDist.parse(getattr(job, field))
        except WorkloadError as e:
            errors[field] = str(e)
    if job.workload_kind == BenchmarkJob.WorkloadKind.TRACE and not job.dataset_path:
        errors["dataset_path"] = "A trace workload needs its JSONL file."
    trace = job.workload_kind == BenchmarkJob.WorkloadKind.TRACE
    if job.duration_s is not None and job.num_requests is not None:
        errors["num_requests"] = "Give duration_s or num_requests, not both."
    elif job.duration_s is None and job.num_requests is None and not trace:
        errors["duration_s"] = "Give duration_s or num_requests."
    if job.slo_class is not None and (job.ttft_slo_ms or job.tpot_slo_ms):
        errors["slo_class"] = "Give an SLO class or explicit SLOs, not both."
    elif (job.ttft_slo_ms is None) != (job.tpot_slo_ms is None):
        errors["tpot_slo_ms" if job.tpot_slo_ms is None else "ttft_slo_ms"] = (
            "Explicit SLOs need both ttft_slo_ms and tpot_slo_ms."
        )
    if job.schedule_every_s is not None and job.schedule_crontab:
        errors["schedule_crontab"] = "Give schedule_every_s or schedule_crontab, not both."
    elif job.schedule_crontab:
        problem = _check_crontab(job.schedule_crontab)
        if problem:
            errors["schedule_crontab"] = problem
    if errors:
        raise ValidationError(errors)


def check_fields(fields: dict[str, Any], caller: str) -> None:
    unknown = set(fields).difference(JOB_FIELDS)
    if unknown:
        raise TypeError(f"{caller}() got unexpected fields {sorted(unknown)}")
