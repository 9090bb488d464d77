"""The console's Benchmarks page: jobs (run now, edit the schedule), recent runs (status,
cancel, JSON export, per-request CSV), charts of a run or of two runs compared.
Writes go through ``shunter.benchmarks.services``."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from shunter.benchmarks import services as benchmarks
from shunter.console import benchmark_figures
from shunter.console.views import staff_required
from shunter.platform.models import BenchmarkJob, BenchmarkRun

RECENT_RUNS = 30


class ScheduleForm(forms.Form):
    """A job's schedule: every N seconds, or a crontab line, or none; and enabled."""

    schedule_every_s = forms.IntegerField(required=False, min_value=1, max_value=366 * 86400)
    schedule_crontab = forms.CharField(required=False, max_length=100)
    enabled = forms.BooleanField(required=False)


def _run_id(raw: str | None) -> int | None:
    return int(raw) if raw and raw.isdigit() and 0 < int(raw) < 2**63 else None


@staff_required
@require_GET
def benchmarks_page(request: HttpRequest) -> HttpResponse:
    """Jobs and recent runs; ``?run=<id>`` charts one run (default: the latest with
    results), ``?a=<id>&b=<id>`` compares two."""
    jobs = list(BenchmarkJob.objects.select_related("node", "deployment__model"))
    recent = list(BenchmarkRun.objects.select_related("job")[:RECENT_RUNS])
    latest: dict[int, BenchmarkRun] = {}
    for run in recent:
        latest.setdefault(run.job_id, run)
    a, b = _run_id(request.GET.get("a")), _run_id(request.GET.get("b"))
    wanted = [a, b] if a and b else [_run_id(request.GET.get("run"))]
    known = {run.pk: run for run in recent}
    missing = [pk for pk in wanted if pk is not None and pk not in known]
    if missing:
        known.update(
            {r.pk: r for r in BenchmarkRun.objects.select_related("job").filter(pk__in=missing)}
        )
    shown = [known[pk] for pk in wanted if pk in known]
    if not shown:
        shown = [r for r in recent if r.results][:1]
    comparison = _comparison_table(shown[0], shown[1]) if len(shown) == 2 else None
    charted = [r for r in shown if r.results]
    return render(
        request,
        "console/benchmarks.html",
        {
            "jobs": [(job, latest.get(job.pk)) for job in jobs],
            "runs": recent,
            "shown": shown,
            "comparison": comparison,
            "figures": {
                "attainment": benchmark_figures.attainment_vs_rate(charted),
                "ttft": benchmark_figures.latency_vs_rate(charted),
                "tpot": benchmark_figures.latency_vs_rate(charted, tpot=True),
            }
            if charted
            else None,
        },
    )


def _comparison_table(a: BenchmarkRun, b: BenchmarkRun) -> list[tuple[Any, ...]]:
    """``run_comparison`` as table rows: series, rate, metric, a, b, delta, ratio."""
    compared = benchmarks.run_comparison(a, b)
    rows = []
    for row in compared["rows"]:
        series = row["series_a"]
        if row["series_b"] != series:
            series = f"{series} / {row['series_b']}"
        for metric in compared["metrics"]:
            v = row[metric]
            rows.append(
                (series, row["request_rate"], metric, v["a"], v["b"], v["delta"], v["ratio"])
            )
    return rows


@staff_required
@require_POST
def job_run(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(BenchmarkJob, pk=job_id)
    run = benchmarks.benchmark_run_start(job=job)
    messages.success(request, f"Run {run.pk} of {job.name} queued.")
    return redirect(reverse("console:benchmarks") + f"?run={run.pk}")


@staff_required
@require_POST
def job_schedule(request: HttpRequest, job_id: int) -> HttpResponse:
    """Change a job's schedule (its PeriodicTask follows)."""
    job = get_object_or_404(BenchmarkJob, pk=job_id)
    form = ScheduleForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"{job.name}: schedule not changed: {form.errors.as_text()}")
        return redirect("console:benchmarks")
    fields: dict[str, Any] = dict(form.cleaned_data)
    fields["schedule_crontab"] = fields["schedule_crontab"].strip()
    try:
        benchmarks.benchmark_job_update(job=job, **fields)
    except ValidationError as e:
        text = "; ".join(str(m) for m in e.messages)
        messages.error(request, f"{job.name}: schedule not changed: {text}")
    else:
        messages.success(request, f"{job.name}: schedule saved.")
    return redirect("console:benchmarks")


@staff_required
@require_POST
def run_cancel(request: HttpRequest, run_id: int) -> HttpResponse:
    run = benchmarks.benchmark_run_cancel(run=get_object_or_404(BenchmarkRun, pk=run_id))
    messages.success(request, f"Run {run.pk}: {run.status}.")
    return redirect(reverse("console:benchmarks") + f"?run={run.pk}")
