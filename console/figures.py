"""Plotly figures of the console, as the JSON that plotly.js draws (``{"data", "layout"}``).

Built here from selector output, rendered into the pages with ``json_script`` and sent
whole over the websocket when they change; the browser draws them with ``Plotly.react``.
Time axes carry Unix milliseconds (plotly reads them as dates on a ``date`` axis).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shunter.console.memory_map import ROW_HBM, ROW_HOST, ROW_LENT, MemoryMap

Figure = dict[str, Any]

# Colour per model (by its position on the node); KV slabs use the same hue, lighter.
PALETTE = ["#1f6fb5", "#d9730d", "#2e8b57", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d"]
LIGHT = ["#8fbbe3", "#f2b985", "#94d1ae", "#c9a3db", "#e79a92", "#8ad6c7", "#c3cacb"]
FREE = "#e3e6e8"
SWAP = "#b07d2b"
BASE_LAYOUT: dict[str, Any] = {
    "margin": {"l": 60, "r": 20, "t": 36, "b": 40},
    "paper_bgcolor": "rgba(0,0,0,0)",
    "plot_bgcolor": "rgba(0,0,0,0)",
    "font": {"family": "system-ui, sans-serif", "size": 12},
    "legend": {"orientation": "h", "y": -0.2},
}


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    return {**BASE_LAYOUT, "title": {"text": title, "font": {"size": 14}}, **extra}


def byte_unit(total: int) -> tuple[str, float]:
    """The unit to draw ``total`` bytes in and its size in bytes."""
    for name, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if total >= 4 * size:
            return name, float(size)
    return "B", 1.0


def attainment_figure(
    title: str,
    series: Mapping[str, Mapping[str, float | None]],
    names: Mapping[str, str],
    span: tuple[float, float],
) -> Figure:
    """One line per tenant: joint SLO attainment (0..1) over time. ``series`` maps a
    tenant id to {bucket start in Unix seconds: attainment, None without requests};
    each trace's ``meta`` is its tenant id so live deltas find it. ``span``: the time
    axis, (start, end) in Unix seconds."""
    data = []
    for tenant_id, points in series.items():
        times = sorted(points, key=int)
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": names.get(tenant_id, tenant_id),
                "meta": tenant_id,
                "x": [int(t) * 1000 for t in times],
                "y": [points[t] for t in times],
                "connectgaps": False,
            }
        )
    layout = _layout(
        title,
        xaxis={"type": "date", "range": [span[0] * 1000, span[1] * 1000]},
        yaxis={"range": [0, 1.05], "tickformat": ".0%", "title": {"text": "both SLOs met"}},
        height=300,
    )
    return {"data": data, "layout": layout}


def memory_figure(memory: MemoryMap, model_order: Sequence[str]) -> Figure:
    """The memory map as horizontal bars: HBM pages by owner, the part of the KV region
    that sits on lent weight pages, and host memory. Hover shows exact bytes."""
    unit, size = byte_unit(max(memory.hbm_bytes, memory.host_bytes, 1))
    colour = {name: i % len(PALETTE) for i, name in enumerate(model_order)}
    data = []
    for s in memory.segments:
        i = colour.get(s.model or "", len(PALETTE) - 1)
        fill = {
            "weights": PALETTE[i],
            "kv": LIGHT[i],
            "free": FREE,
            "lent": LIGHT[i],
            "host_weights": PALETTE[i],
            "swap": SWAP,
            "swap_free": FREE,
        }[s.kind]
        marker: dict[str, Any] = {"color": fill, "line": {"color": "#ffffff", "width": 1}}
        if s.kind == "lent":
            marker["pattern"] = {"shape": "/", "fgcolor": PALETTE[i]}
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": s.label,
                "y": [s.row],
                "x": [s.bytes / size],
                "base": [s.offset / size],
                "marker": marker,
                "hovertemplate": f"{s.label}: {s.bytes:,} bytes<extra></extra>",
                "showlegend": s.row != ROW_LENT,
            }
        )
    layout = _layout(
        f"Memory map ({unit})",
        barmode="overlay",
        height=260,
        yaxis={"categoryorder": "array", "categoryarray": [ROW_HOST, ROW_LENT, ROW_HBM]},
    )
    return {"data": data, "layout": layout}


def requests_figure(requests: Mapping[str, Mapping[str, int]]) -> Figure:
    """Requests running, waiting and rotary per model (grouped bars)."""
    models = list(requests)
    data = [
        {
            "type": "bar",
            "name": state,
            "x": models,
            "y": [int(requests[m].get(state, 0)) for m in models],
            "marker": {"color": colour},
        }
        for state, colour in (("running", "#2e8b57"), ("waiting", "#d9a400"), ("rotary", "#8e44ad"))
    ]
    layout = _layout(
        "Requests per model", barmode="group", height=260, yaxis={"rangemode": "tozero"}
    )
    return {"data": data, "layout": layout}


def step_times_figure(steps: Sequence[tuple[int, float]]) -> Figure:
    """Recent step durations in milliseconds against the step's number; the browser
    extends the trace as steps arrive."""
    data = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": "step",
            "x": [index for index, _ in steps],
            "y": [ms for _, ms in steps],
            "line": {"color": "#1f6fb5"},
        }
    ]
    layout = _layout(
        "Recent step times",
        height=260,
        xaxis={"title": {"text": "step"}},
        yaxis={"title": {"text": "ms"}, "rangemode": "tozero"},
        showlegend=False,
    )
    return {"data": data, "layout": layout}


def latency_histogram_figure(
    title: str, samples: Mapping[str, Sequence[float]], unit: str = "ms"
) -> Figure:
    """Overlaid histograms, one per key of ``samples`` (a deployment's label)."""
    data = [
        {"type": "histogram", "name": name, "x": list(values), "opacity": 0.65}
        for name, values in samples.items()
    ]
    layout = _layout(
        title,
        barmode="overlay",
        height=260,
        xaxis={"title": {"text": unit}},
        yaxis={"title": {"text": "requests"}},
    )
    return {"data": data, "layout": layout}
