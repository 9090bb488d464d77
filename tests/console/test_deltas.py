"""Deltas between console snapshots: only what changed, set semantics, steps appended."""

from __future__ import annotations

import copy
from typing import Any

from shunter.console.deltas import (
    OVERVIEW_GROUP,
    broadcast_messages,
    node_delta,
    node_group,
    overview_delta,
    with_rates,
)
from shunter.console.selectors import NodeView, Overview


def row(tenant_id: int, requests: int) -> dict[str, Any]:
    window = {"requests": requests, "errors": 0, "ttft": 1.0, "tbt": 1.0, "joint": 1.0}
    return {"id": tenant_id, "name": f"t{tenant_id}", "windows": {"1": window}}


def overview(**changes: Any) -> Overview:
    base: dict[str, Any] = {
        "at": 100.0,
        "tenants": {"1": row(1, 5), "2": row(2, 0)},
        "order": ["1", "2"],
        "minute": {"1": {"60": 1.0}, "2": {}},
        "fine": {"1": {"95": 1.0}, "2": {}},
        "minute_since": 0,
        "fine_since": 0,
    }
    base.update(changes)
    return base  # type: ignore[return-value]


def view(**changes: Any) -> NodeView:
    base: dict[str, Any] = {
        "id": 7,
        "name": "gpu-0",
        "status": "healthy",
        "state_at": 10.0,
        "turn_holder": "a",
        "counters": {"rotations": 10, "bytes_d2h": 0, "bytes_h2d": 0, "steps": 100},
        "steps": [[99, 1.0], [100, 1.5]],
        "rates": None,
    }
    base.update(changes)
    return base  # type: ignore[return-value]


def test_nothing_changed_means_no_delta() -> None:
    assert overview_delta(overview(), overview(at=101.0)) == {}
    assert node_delta(view(), view()) == {}
    assert (
        broadcast_messages(
            {"overview": overview(), "nodes": {"7": view()}},
            {"overview": overview(at=102.0), "nodes": {"7": view()}},
        )
        == []
    )


def test_overview_delta_has_changed_rows_points_and_removals() -> None:
    prev = overview()
    cur = overview(
        at=101.0,
        tenants={"1": row(1, 6)},
        order=["1"],
        minute={"1": {"60": 0.5, "120": 1.0}},
        fine={"1": {"95": 1.0, "100": 0.0}},
        fine_since=5,
    )
    delta = overview_delta(prev, cur)
    assert delta == {
        "at": 101.0,
        "tenants": {"1": row(1, 6)},
        "removed": ["2"],
        "order": ["1"],
        "minute": {"1": {"60": 0.5, "120": 1.0}},
        "fine": {"1": {"100": 0.0}},
        "fine_since": 5,
    }


def test_first_overview_delta_is_everything() -> None:
    cur = overview()
    delta = overview_delta(None, cur)
    assert delta["tenants"] == cur["tenants"] and delta["minute"] == cur["minute"]
    assert delta["order"] == ["1", "2"]


def test_a_tenant_created_since_brings_its_row_place_and_lines() -> None:
    # Tenant 3 ("a new one") sorts first; it has no requests yet, so no points.
    new = {**row(3, 0), "name": "a new one"}
    prev = overview()
    cur = overview(
        at=101.0,
        tenants={"3": new, "1": row(1, 5), "2": row(2, 0)},
        order=["3", "1", "2"],
        minute={"3": {}, "1": {"60": 1.0}, "2": {}},
        fine={"3": {}, "1": {"95": 1.0}, "2": {}},
    )
    assert overview_delta(prev, cur) == {
        "at": 101.0,
        "tenants": {"3": new},
        "order": ["3", "1", "2"],
        "minute": {"3": {}},
        "fine": {"3": {}},
    }
    # Its first request: only its points follow.
    later = overview(
        at=102.0,
        tenants={"3": {**new, "windows": row(3, 1)["windows"]}, "1": row(1, 5), "2": row(2, 0)},
        order=["3", "1", "2"],
        minute={"3": {"60": 0.0}, "1": {"60": 1.0}, "2": {}},
        fine={"3": {"100": 0.0}, "1": {"95": 1.0}, "2": {}},
    )
    delta = overview_delta(cur, later)
    assert set(delta) == {"at", "tenants", "minute", "fine"}
    assert delta["minute"] == {"3": {"60": 0.0}} and delta["fine"] == {"3": {"100": 0.0}}


def test_a_deleted_tenant_is_removed_with_its_place_and_lines() -> None:
    cur = overview(
        at=101.0,
        tenants={"2": row(2, 0)},
        order=["2"],
        minute={"2": {}},
        fine={"2": {}},
    )
    assert overview_delta(overview(), cur) == {"at": 101.0, "removed": ["1"], "order": ["2"]}


def test_a_renamed_tenant_moves_to_its_place() -> None:
    renamed = {**row(2, 0), "name": "a first"}
    cur = overview(tenants={"1": row(1, 5), "2": renamed}, order=["2", "1"])
    assert overview_delta(overview(), cur) == {
        "at": 100.0,
        "tenants": {"2": renamed},
        "order": ["2", "1"],
    }


def test_node_delta_sends_changed_fields_and_new_steps_only() -> None:
    prev = view()
    cur = view(turn_holder="b", steps=[[100, 1.5], [101, 2.0], [102, 2.5]])
    assert node_delta(prev, cur) == {"turn_holder": "b", "steps": [[101, 2.0], [102, 2.5]]}
    # The engine restarted: its step count went back, the page starts over.
    restarted = view(steps=[[1, 3.0], [2, 3.0]])
    assert node_delta(prev, restarted) == {"steps_reset": [[1, 3.0], [2, 3.0]]}


def test_rates_between_two_engine_states() -> None:
    prev = view()
    cur = view(
        state_at=12.0,
        counters={"rotations": 16, "bytes_d2h": 4_000_000_000, "bytes_h2d": 10**9, "steps": 180},
    )
    rated = with_rates(prev, cur)
    assert rated["rates"] == {
        "rotations_per_s": 3.0,
        "d2h_gb_per_s": 2.0,
        "h2d_gb_per_s": 0.5,
        "steps_per_s": 40.0,
    }
    # The same engine state again keeps the rates; a restart (counters down) clears them.
    assert with_rates(rated, copy.deepcopy(cur))["rates"] == rated["rates"]
    later = view(state_at=14.0)
    assert with_rates(rated, later)["rates"] is None
    assert with_rates(None, cur)["rates"] is None


def test_messages_go_to_each_topics_group() -> None:
    prev = {"overview": overview(), "nodes": {"7": view()}}
    cur = {
        "overview": overview(tenants={"1": row(1, 9), "2": row(2, 0)}),
        "nodes": {"7": view(status="unhealthy")},
    }
    messages = broadcast_messages(prev, cur)  # type: ignore[arg-type]
    assert [group for group, _ in messages] == [OVERVIEW_GROUP, node_group(7)]
    assert messages[1][1] == {"status": "unhealthy"}
