"""Results of simulated runs as rows, a printed table, JSON and a Plotly HTML page.

Everything here says SIMULATED: these numbers come from a cost model, not a GPU.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shunter.engine.sim.hardware import GB
from shunter.engine.sim.metrics import Summary
from shunter.engine.sim.runner import SimRun

LABEL = "SIMULATED"

Row = dict[str, Any]


def result_row(policy: str, rps: float, summary: Summary, run: SimRun) -> Row:
    """One JSON result: the issue's keys first, then the rest of the metrics."""
    return {
        "policy": policy,
        "rps": rps,
        "ttft_attainment": summary.ttft_attainment,
        "tbt_attainment": summary.tbt_attainment,
        "slo_attainment": summary.slo_attainment,
        "goodput": summary.goodput,
        "p99_ttft_s": summary.ttft_s.p99,
        "p99_tpot_s": summary.tpot_s.p99,
        "throughput_tok_s": summary.throughput_tok_s,
        "rotations": run.rotations,
        "p50_ttft_s": summary.ttft_s.p50,
        "p90_ttft_s": summary.ttft_s.p90,
        "p50_tpot_s": summary.tpot_s.p50,
        "p90_tpot_s": summary.tpot_s.p90,
        "p50_itl_s": summary.itl_s.p50,
        "p90_itl_s": summary.itl_s.p90,
        "p99_itl_s": summary.itl_s.p99,
        "itl_within_tbt": summary.itl_within_tbt,
        "gb_d2h": run.d2h_bytes / GB,
        "gb_h2d": run.h2d_bytes / GB,
        "peak_hbm_gb": run.peak_hbm_bytes / GB,
        "peak_dram_gb": run.peak_host_bytes / GB,
        "num_requests": summary.num_requests,
        "num_succeeded": summary.num_succeeded,
        "sim_duration_s": run.sim_duration_s,
        "num_steps": run.num_steps,
        "stall_s": run.stall_s,
        "wall_s": run.wall_s,
    }


# (header, row key, format): the printed table's columns.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "policy", "{:<6}"),
    ("rps", "rps", "{:>6.1f}"),
    ("TTFT%", "ttft_attainment", "{:>6.1%}"),
    ("TBT%", "tbt_attainment", "{:>6.1%}"),
    ("both%", "slo_attainment", "{:>6.1%}"),
    ("goodput", "goodput", "{:>7.2f}"),
    ("TTFT p50", "p50_ttft_s", "{:>8.3f}"),
    ("TTFT p99", "p99_ttft_s", "{:>8.3f}"),
    ("TPOT p50", "p50_tpot_s", "{:>8.4f}"),
    ("TPOT p99", "p99_tpot_s", "{:>8.4f}"),
    ("ITL p99", "p99_itl_s", "{:>7.4f}"),
    ("tok/s", "throughput_tok_s", "{:>7.0f}"),
    ("rotations", "rotations", "{:>9d}"),
    ("GB D2H", "gb_d2h", "{:>7.1f}"),
    ("GB H2D", "gb_h2d", "{:>7.1f}"),
    ("HBM GB", "peak_hbm_gb", "{:>6.1f}"),
    ("DRAM GB", "peak_dram_gb", "{:>7.1f}"),
)


def _cell(fmt: str, value: Any) -> str:
    return "-" if value is None else fmt.format(value)


Column = tuple[str, str, str]


def format_table(rows: Sequence[Row], title: str, columns: Sequence[Column] = COLUMNS) -> str:
    """A fixed-width table, one line per row (by default per policy and rate), headed
    with the SIMULATED label. Latencies are seconds; goodput is requests meeting both
    SLOs per second."""
    cells = [[_cell(fmt, row[key]) for _, key, fmt in columns] for row in rows]
    widths = [
        max(len(header), *(len(line[i]) for line in cells)) if cells else len(header)
        for i, (header, _, _) in enumerate(columns)
    ]
    header = "  ".join(h.rjust(w) for (h, _, _), w in zip(columns, widths, strict=True))
    lines = [f"{LABEL}: {title}", header, "-" * len(header)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(lines)


def write_json(path: str | Path, config: Mapping[str, Any], rows: Sequence[Row]) -> None:
    """``{"simulated": true, "config": {...}, "results": [...]}``."""
    doc = {"simulated": True, "config": dict(config), "results": list(rows)}
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


# (row key, panel title, y-axis title; attainments are shares plotted as percent).
Panel = tuple[str, str, str]
ATTAINMENT_PANELS: tuple[Panel, ...] = (
    ("ttft_attainment", "TTFT SLO attainment", "attainment (%)"),
    ("tbt_attainment", "TBT SLO attainment", "attainment (%)"),
    ("slo_attainment", "TTFT and TBT SLO attainment", "attainment (%)"),
)
Timeline = tuple[str, Sequence[tuple[float, float]]]
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def write_plot(
    path: str | Path,
    rows: Sequence[Row],
    title: str,
    *,
    series: str = "policy",
    panels: Sequence[Panel] = ATTAINMENT_PANELS,
    timelines: Sequence[Timeline] = (),
    timeline_title: str = "",
) -> None:
    """A self-contained HTML page: each panel's value against request rate, one line per
    ``series`` value (policy by default); with ``timelines``, a last row of step lines
    over simulated time (``(name, [(t, value), ...])``)."""
    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.subplots import make_subplots

    rows_n = 2 if timelines else 1
    titles = [t for _, t, _ in panels] + ([timeline_title] if timelines else [])
    specs: list[list[dict[str, Any] | None]] = [[{}] * len(panels)]
    if timelines:
        specs.append([{"colspan": len(panels)}] + [None] * (len(panels) - 1))
    fig = make_subplots(rows=rows_n, cols=len(panels), subplot_titles=titles, specs=specs)
    names = list(dict.fromkeys(row[series] for row in rows))
    for i, name in enumerate(names):
        points = sorted((r for r in rows if r[series] == name), key=lambda r: r["rps"])
        for col, (key, _, axis) in enumerate(panels, start=1):
            percent = key.endswith("attainment")
            fig.add_trace(
                go.Scatter(
                    x=[r["rps"] for r in points],
                    y=[(100 if percent else 1) * r[key] for r in points],
                    mode="lines+markers",
                    name=str(name),
                    legendgroup=str(name),
                    showlegend=col == 1,
                    line={"color": COLORS[i % len(COLORS)]},
                ),
                row=1,
                col=col,
            )
            fig.update_xaxes(title_text="request rate (req/s)", row=1, col=col)
            fig.update_yaxes(title_text=axis, range=[0, 105] if percent else None, row=1, col=col)
    for i, (name, timeline) in enumerate(timelines):
        fig.add_trace(
            go.Scatter(
                x=[t for t, _ in timeline],
                y=[v for _, v in timeline],
                mode="lines",
                line={"shape": "hv", "color": COLORS[i % len(COLORS)], "dash": "dot"},
                name=name,
            ),
            row=2,
            col=1,
        )
    if timelines:
        fig.update_xaxes(title_text="simulated time (s)", row=2, col=1)
        fig.update_yaxes(title_text=timeline_title, row=2, col=1)
    fig.update_layout(title=f"{LABEL}: {title}", template="plotly_white")
    html = pio.to_html(fig, include_plotlyjs=True, full_html=True)
    Path(path).write_text(html)
