"""What changed between two console snapshots: the messages the broadcaster sends.

A delta only ever *sets* values (whole tenant rows, series points keyed by bucket time,
node fields) or names what to drop, so applying one to any earlier state of the page,
even one newer than the delta's base, gives the current state. Step times are the one
append-only part: points carry the engine's step number and the browser keeps only
numbers above its last one.
"""

from __future__ import annotations

from typing import Any, TypedDict

from shunter.console.selectors import NodeView, Overview

OVERVIEW_GROUP = "console.overview"
GB = 1e9


def node_group(node_id: int | str) -> str:
    return f"console.node.{node_id}"


class Snapshot(TypedDict):
    overview: Overview
    nodes: dict[str, NodeView]


def _changed_points(
    before: dict[str, dict[str, float | None]], after: dict[str, dict[str, float | None]]
) -> dict[str, dict[str, float | None]]:
    """Points new or changed per tenant; a tenant new to the series is there even
    without points, so that the page adds its line."""
    changed: dict[str, dict[str, float | None]] = {}
    for tenant_id, points in after.items():
        old = before.get(tenant_id)
        if old is None:
            changed[tenant_id] = dict(points)
            continue
        diff = {t: v for t, v in points.items() if t not in old or old[t] != v}
        if diff:
            changed[tenant_id] = diff
    return changed


def overview_delta(prev: Overview | None, cur: Overview) -> dict[str, Any]:
    """Tenant rows that changed (whole; a tenant created since ``prev`` is one), tenants
    removed, the rows' ``order`` when tenants came, went or were renamed, series points
    new or changed, and the series' window starts when they moved. Empty when nothing
    changed."""
    if prev is None:
        return {
            "at": cur["at"],
            "tenants": cur["tenants"],
            "removed": [],
            "order": cur["order"],
            "minute": cur["minute"],
            "fine": cur["fine"],
            "minute_since": cur["minute_since"],
            "fine_since": cur["fine_since"],
        }
    delta: dict[str, Any] = {}
    rows = {k: row for k, row in cur["tenants"].items() if prev["tenants"].get(k) != row}
    if rows:
        delta["tenants"] = rows
    removed = [k for k in prev["tenants"] if k not in cur["tenants"]]
    if removed:
        delta["removed"] = removed
    if prev["order"] != cur["order"]:
        delta["order"] = cur["order"]
    for name, before, after in (
        ("minute", prev["minute"], cur["minute"]),
        ("fine", prev["fine"], cur["fine"]),
    ):
        points = _changed_points(before, after)
        if points:
            delta[name] = points
    if prev["minute_since"] != cur["minute_since"]:
        delta["minute_since"] = cur["minute_since"]
    if prev["fine_since"] != cur["fine_since"]:
        delta["fine_since"] = cur["fine_since"]
    if delta:
        delta["at"] = cur["at"]
    return delta


def with_rates(prev: NodeView | None, cur: NodeView) -> NodeView:
    """``cur`` with rotations/s and GB/s each way since ``prev`` (the same node's view at
    an earlier engine state). The same state as before keeps the earlier rates; counters
    that went down (the engine restarted) or no earlier state give None."""
    if prev is None or prev["state_at"] is None or cur["state_at"] is None:
        return cur
    dt = cur["state_at"] - prev["state_at"]
    if dt <= 0:
        return {**cur, "rates": prev["rates"]}
    a, b = prev["counters"], cur["counters"]
    if any(b[k] < a[k] for k in ("rotations", "bytes_d2h", "bytes_h2d")):
        return {**cur, "rates": None}
    rates = {
        "rotations_per_s": round((b["rotations"] - a["rotations"]) / dt, 3),
        "d2h_gb_per_s": round((b["bytes_d2h"] - a["bytes_d2h"]) / dt / GB, 6),
        "h2d_gb_per_s": round((b["bytes_h2d"] - a["bytes_h2d"]) / dt / GB, 6),
        "steps_per_s": round((b["steps"] - a["steps"]) / dt, 3) if b["steps"] >= a["steps"] else 0,
    }
    return {**cur, "rates": rates}


def node_delta(prev: NodeView | None, cur: NodeView) -> dict[str, Any]:
    """Fields of the node view that changed, with ``steps`` holding only steps newer
    than ``prev``'s (``steps_reset`` instead, with all of them, when the engine's step
    count went back). Empty when nothing changed."""
    if prev is None:
        return {k: v for k, v in cur.items()}
    delta = {k: v for k, v in cur.items() if k != "steps" and prev.get(k) != v}
    last = max((int(i) for i, _ in prev["steps"]), default=0)
    if cur["steps"] and int(cur["steps"][-1][0]) < last:
        delta["steps_reset"] = cur["steps"]
    else:
        new = [p for p in cur["steps"] if int(p[0]) > last]
        if new:
            delta["steps"] = new
    return delta


def broadcast_messages(prev: Snapshot | None, cur: Snapshot) -> list[tuple[str, dict[str, Any]]]:
    """(group, delta) pairs from ``prev`` to ``cur``; unchanged topics send nothing."""
    messages: list[tuple[str, dict[str, Any]]] = []
    overview = overview_delta(prev["overview"] if prev else None, cur["overview"])
    if overview:
        messages.append((OVERVIEW_GROUP, overview))
    before = prev["nodes"] if prev else {}
    for node_id, view in cur["nodes"].items():
        delta = node_delta(before.get(node_id), view)
        if delta:
            messages.append((node_group(node_id), delta))
    return messages
