"""Reading runs: one run as a JSON document, and two runs compared metric by metric."""

from __future__ import annotations

from typing import Any

from shunter.benchmarks.progress import PER_REQUEST_FIELDS, stored_result
from shunter.platform.models import BenchmarkRun


# -- reads: export and comparison ----------------------------------------------------------
def run_export(run: BenchmarkRun, *, requests_url: str | None = None) -> dict[str, Any]:
    """A run as one JSON document: what ran, how it ended, and its per-rate results
    (simulated runs say so in ``label``). Per-request detail is not in it: ``requests``
    says that each request's row, its error included, is in the run's CSV, downloadable
    at ``requests_url`` (None while the run has no CSV)."""

    def iso(value: Any) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "label": "SIMULATED" if run.simulated else "MEASURED",
        "run": {
            "id": run.pk,
            "job": run.job_id,
            "job_name": run.job.name,
            "status": run.status,
            "trigger": run.trigger,
            "target": run.target_label,
            "simulated": run.simulated,
            "created_at": iso(run.created_at),
            "started_at": iso(run.started_at),
            "finished_at": iso(run.finished_at),
            "error": run.error,
        },
        "config": run.config,
        # Runs stored before results left out the per-request fields still hold them.
        "results": [stored_result(row) for row in run.results],
        "requests": {
            "csv": requests_url if run.requests_csv else None,
            "left_out": sorted(PER_REQUEST_FIELDS),
            "note": (
                "Each request's row (times, tokens, error) is in the run's CSV; the results "
                "leave out their per-request lists and keep error_counts."
            ),
        },
    }


COMPARED_METRICS = (
    "completed",
    "failed",
    "request_throughput",
    "output_throughput",
    "request_goodput",
    "mean_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "p99_itl_ms",
    "ttft_attainment",
    "tbt_attainment",
    "slo_attainment",
)


def _series(run: BenchmarkRun) -> list[str]:
    return list(dict.fromkeys(str(row.get("series", "")) for row in run.results))


def run_comparison(a: BenchmarkRun, b: BenchmarkRun) -> dict[str, Any]:
    """Run ``b`` against ``a``, per series and rate present in both: each of
    ``COMPARED_METRICS`` as ``{"a", "b", "delta": b - a, "ratio": b / a}`` (None where
    a value is missing or the ratio undefined). Series of the same name are paired;
    otherwise the runs' series are paired in order (two targets, one line each)."""
    series_a, series_b = _series(a), _series(b)
    common = [s for s in series_a if s in series_b]
    pairs = [(s, s) for s in common] if common else list(zip(series_a, series_b, strict=False))
    index_b = {(str(r.get("series", "")), str(r.get("request_rate"))): r for r in b.results}
    rows = []
    for row_a in a.results:
        name_a = str(row_a.get("series", ""))
        for left, right in pairs:
            if left != name_a:
                continue
            row_b = index_b.get((right, str(row_a.get("request_rate"))))
            if row_b is None:
                continue
            rows.append(
                {
                    "series_a": left,
                    "series_b": right,
                    "request_rate": row_a.get("request_rate"),
                    **{m: _compared(row_a.get(m), row_b.get(m)) for m in COMPARED_METRICS},
                }
            )
    return {"a": a.pk, "b": b.pk, "metrics": list(COMPARED_METRICS), "rows": rows}


def _compared(va: Any, vb: Any) -> dict[str, float | None]:
    number = (int, float)
    if not isinstance(va, number) or not isinstance(vb, number):
        return {
            "a": va if isinstance(va, number) else None,
            "b": vb if isinstance(vb, number) else None,
            "delta": None,
            "ratio": None,
        }
    return {"a": va, "b": vb, "delta": vb - va, "ratio": vb / va if va else None}
