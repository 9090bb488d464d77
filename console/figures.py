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


# A legend beside the plot, for figures with a titled x axis: below it, the legend and
# the axis title would overlap.
SIDE_LEGEND: dict[str, Any] = {"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1}


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
    step_s: int,
) -> Figure:
    """One line per tenant: joint SLO attainment (0..1) over time. ``series`` maps a
    tenant id to {bucket start in Unix seconds: attainment, None without requests};
    each trace's ``meta`` is its tenant id so live deltas find it. ``span``: the time
    axis, (start, end) in Unix seconds; ``step_s``: the buckets' length. A bucket without
    requests breaks the line (``with_gaps``) rather than being drawn across; the page's
    script does the same for live points, reading ``layout.meta.step_s``."""
    data = []
    for tenant_id, points in series.items():
        times, values = with_gaps(points, step_s)
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": names.get(tenant_id, tenant_id),
                "meta": tenant_id,
                "x": [t * 1000 for t in times],
                "y": values,
                "connectgaps": False,
            }
        )
    layout = _layout(
        title,
        xaxis={"type": "date", "range": [span[0] * 1000, span[1] * 1000]},
        yaxis={"range": [0, 1.05], "tickformat": ".0%", "title": {"text": "both SLOs met"}},
        height=300,
        meta={"step_s": step_s},
    )
    return {"data": data, "layout": layout}


def with_gaps(
    points: Mapping[str, float | None], step_s: int
) -> tuple[list[int], list[float | None]]:
    """The points in time order, with a None one bucket after each point that the next
    does not follow at once: plotly then leaves the empty buckets blank."""
    times = sorted(int(t) for t in points)
    out_t: list[int] = []
    out_v: list[float | None] = []
    for i, t in enumerate(times):
        out_t.append(t)
        out_v.append(points[str(t)])
        if i + 1 < len(times) and times[i + 1] - t > step_s:
            out_t.append(t + step_s)
            out_v.append(None)
    return out_t, out_v


def memory_figure(memory: MemoryMap, model_order: Sequence[str]) -> Figure:
    """The memory map as two charts, each to its own scale: the device (HBM pages by
    owner, and under them the part of the KV region that sits on lent weight pages) and
    host memory (each model's weight copy, the KV swap space). Hover shows exact bytes.
    A model's colour is one hue: weights solid, KV light, its lent layers and its host
    weight copy light with a pattern in the solid colour (hatched and dotted)."""
    device_unit, device_size = byte_unit(max(memory.hbm_bytes, 1))
    host_unit, host_size = byte_unit(max(memory.host_bytes, 1))
    colour = {name: i % len(PALETTE) for i, name in enumerate(model_order)}
    data = []
    for s in memory.segments:
        i = colour.get(s.model or "", len(PALETTE) - 1)
        fill = {
            "weights": PALETTE[i],
            "kv": LIGHT[i],
            "free": FREE,
            "lent": LIGHT[i],
            "host_weights": LIGHT[i],
            "swap": SWAP,
            "swap_free": FREE,
        }[s.kind]
        marker: dict[str, Any] = {"color": fill, "line": {"color": "#ffffff", "width": 1}}
        pattern = {"lent": "/", "host_weights": "."}.get(s.kind)
        if pattern:
            marker["pattern"] = {"shape": pattern, "fgcolor": PALETTE[i], "solidity": 0.4}
        host = s.row == ROW_HOST
        size = host_size if host else device_size
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": s.label,
                "y": [s.row],
                "x": [s.bytes / size],
                "base": [s.offset / size],
                "xaxis": "x2" if host else "x",
                "yaxis": "y2" if host else "y",
                "marker": marker,
                "hovertemplate": f"{s.label}: {s.bytes:,} bytes<extra></extra>",
                "showlegend": s.row != ROW_LENT,
            }
        )
    layout = _layout(
        "Memory map",
        barmode="overlay",
        height=320,
        xaxis={"title": {"text": f"device, {device_unit}"}, "anchor": "y", "rangemode": "tozero"},
        yaxis={
            "domain": [0.52, 1.0],
            "categoryorder": "array",
            "categoryarray": [ROW_LENT, ROW_HBM],
        },
        xaxis2={"title": {"text": f"host, {host_unit}"}, "anchor": "y2", "rangemode": "tozero"},
        yaxis2={"domain": [0.0, 0.22], "categoryorder": "array", "categoryarray": [ROW_HOST]},
    )
    layout["legend"] = SIDE_LEGEND
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
