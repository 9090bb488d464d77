"""Plotly figures of benchmark runs, against the request rate: SLO attainment and
latency percentiles, one line per series (a run's target, or a simulated policy or
variant; with several runs, each run's series are prefixed by its id)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from shunter.console.figures import PALETTE, SIDE_LEGEND, Figure, _layout
from shunter.platform.models import BenchmarkRun

# (result key, legend suffix, dash) per drawn quantity.
ATTAINMENT = (
    ("slo_attainment", "both", "solid"),
    ("ttft_attainment", "TTFT", "dot"),
    ("tbt_attainment", "TBT", "dash"),
)
LATENCY = (
    ("median_ttft_ms", "TTFT P50", "solid"),
    ("p90_ttft_ms", "TTFT P90", "dash"),
    ("p99_ttft_ms", "TTFT P99", "dot"),
)
TPOT = (
    ("median_tpot_ms", "TPOT P50", "solid"),
    ("p90_tpot_ms", "TPOT P90", "dash"),
    ("p99_tpot_ms", "TPOT P99", "dot"),
)


def _rate(value: Any) -> float | None:
    try:
        rate = float(value)
    except (TypeError, ValueError):
        return None
    return rate if math.isfinite(rate) else None


def run_series(runs: Sequence[BenchmarkRun]) -> dict[str, list[dict[str, Any]]]:
    """Each series' finite-rate results, by label, sorted by rate."""
    series: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        prefix = f"#{run.pk} " if len(runs) > 1 else ""
        for row in run.results:
            if _rate(row.get("request_rate")) is None:
                continue
            label = prefix + str(row.get("series", run.target_label))
            series.setdefault(label, []).append(row)
    for rows in series.values():
        rows.sort(key=lambda r: _rate(r["request_rate"]) or 0.0)
    return series


def _lines(
    series: dict[str, list[dict[str, Any]]], quantities: Sequence[tuple[str, str, str]]
) -> list[dict[str, Any]]:
    data = []
    for i, (label, rows) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        for key, suffix, dash in quantities:
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": f"{label} · {suffix}",
                    "legendgroup": label,
                    "x": [_rate(r["request_rate"]) for r in rows],
                    "y": [r.get(key) for r in rows],
                    "line": {"color": colour, "dash": dash},
                }
            )
    return data


def attainment_vs_rate(runs: Sequence[BenchmarkRun]) -> Figure:
    """TTFT, TBT and joint SLO attainment against the request rate."""
    layout = _layout(
        "SLO attainment vs request rate",
        height=340,
        xaxis={"title": {"text": "requests/s"}},
        yaxis={"range": [0, 1.05], "tickformat": ".0%", "title": {"text": "requests meeting"}},
        legend=SIDE_LEGEND,
    )
    return {"data": _lines(run_series(runs), ATTAINMENT), "layout": layout}


def latency_vs_rate(runs: Sequence[BenchmarkRun], *, tpot: bool = False) -> Figure:
    """P50 / P90 / P99 of TTFT (or TPOT) in milliseconds against the request rate."""
    name = "TPOT" if tpot else "TTFT"
    layout = _layout(
        f"{name} percentiles vs request rate",
        height=340,
        xaxis={"title": {"text": "requests/s"}},
        yaxis={"title": {"text": "ms"}, "rangemode": "tozero"},
        legend=SIDE_LEGEND,
    )
    return {"data": _lines(run_series(runs), TPOT if tpot else LATENCY), "layout": layout}
