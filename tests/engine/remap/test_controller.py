"""The controller's decisions: when, which model, how many, and dynamic reversion."""

from __future__ import annotations

import dataclasses

import pytest

from shunter.engine.config import CAPACITY_SOURCES, RemapConfig
from shunter.engine.remap.controller import ModelState, Pressure, RemapController, RemapDecision
from shunter.engine.remap.frames import WeightMap, transition
from shunter.engine.remap.layers import select

LAYER = 100  # bytes one remapped layer gives the KV cache


def model(
    name: str,
    *,
    active: bool = False,
    priority: int = 0,
    t_last: float = 0.0,
    alpha: int = 0,
    layers: int = 40,
    t_transfer: float = 0.0,
) -> ModelState:
    return ModelState(
        name=name,
        num_layers=layers,
        frame_bytes=LAYER,
        priority=priority,
        active=active,
        t_last_active=t_last,
        alpha=alpha,
        t_transfer=t_transfer,
        t_decode=0.04,
        t_prefill=0.4,
    )


def controller(
    cap: float = 0.5, headroom: int = 0, order: tuple[str, ...] = CAPACITY_SOURCES
) -> RemapController:
    config = RemapConfig(enabled=True, cap_fraction=cap, capacity_order=order)
    return RemapController(config, headroom=headroom)


def test_no_deficit_no_remap() -> None:
    d = controller().plan([model("a", active=True), model("b")], Pressure(500, 500), ["a", "b"])
    assert d.targets == {}


def test_inactive_models_lowest_priority_first_then_mru_then_active() -> None:
    models = [
        model("active", active=True),
        model("high", priority=2, t_last=9.0),
        model("low_old", priority=1, t_last=1.0),
        model("low_recent", priority=1, t_last=5.0),
    ]
    c = controller(cap=0.25)  # 10 of 40 layers per model
    order = ["active", "high", "low_old", "low_recent"]
    assert c.plan(models, Pressure(demand=350, free=0), order).targets == {"low_recent": 4}
    assert c.plan(models, Pressure(demand=1500, free=0), order).targets == {
        "low_recent": 10,
        "low_old": 5,
    }
    # Active layers only once every inactive model is at its cap.
    assert c.plan(models, Pressure(demand=3500, free=0), order).targets == {
        "low_recent": 10,
        "low_old": 10,
        "high": 10,
        "active": 5,
    }


def test_caps_bound_every_model_and_no_model_is_remapped_whole() -> None:
    models = [model("a", active=True, layers=8), model("b", layers=8)]
    d = controller(cap=0.99).plan(models, Pressure(demand=10**9, free=0), ["a", "b"])
    assert d.targets == {"b": 6, "a": 6}  # 8 layers: at most 6 remapped, 1 slot, 1 resident


def test_how_many_follows_t_transfer_against_t_compute() -> None:
    # T_T = 0.01 s per layer. Inactive: T_compute is the 0.4 s prefill, so T_c = 10 ms;
    # Eq. 4 holds up to 19 layers, Eq. 5 (two slots) up to 38, and the cap (28 of 40)
    # binds. Active: the 40 ms decode gives T_c = 1 ms: Eq. 4 allows 2
    # (10 * (alpha + 1) <= 39 - alpha) and Eq. 5 no more (10 * 5 > 40).
    c = controller(cap=0.7)
    inactive = model("b", t_transfer=0.01)
    active = model("a", active=True, t_transfer=0.01)
    assert c.cap(inactive) == 28
    assert c.cap(dataclasses.replace(inactive, t_prefill=0.2)) == 18  # Eq. 5: 20 * 5 ms
    assert c.cap(active) == 2
    d = c.plan([active, inactive], Pressure(demand=10**9, free=0), ["a", "b"])
    assert d.targets == {"b": 28, "a": 2}


def test_rotation_covers_its_share_before_active_layers_in_the_default_order() -> None:
    models = [model("a", active=True), model("b", alpha=20)]  # b is at its cap
    pressure = Pressure(demand=800, free=0, rotation=500)
    assert controller().plan(models, pressure, ["a", "b"]).targets == {"a": 3}
    no_rotation_first = controller(order=("free", "inactive", "active", "rotation"))
    assert no_rotation_first.plan(models, pressure, ["a", "b"]).targets == {"a": 8}
    never_active = controller(order=("free", "inactive", "rotation"))
    assert never_active.plan(models, pressure, ["a", "b"]).targets == {}


def test_reversion_restores_what_the_surplus_over_headroom_pays_for_in_run_next_order() -> None:
    models = [model("a", active=True), model("b", alpha=3), model("c", alpha=2)]
    c = controller(headroom=50)
    run_next = ["a", "c", "b"]

    def plan(free: int) -> RemapDecision:
        return c.plan(models, Pressure(demand=0, free=free), run_next)

    # Less than a layer beyond the headroom: hold.
    assert plan(50 + LAYER - 1).targets == {}
    # One layer's worth: c, which runs next, gets one back.
    assert plan(50 + LAYER).targets == {"c": 1}
    # Three: c's two, then one of b's; c first.
    d = plan(50 + 3 * LAYER)
    assert list(d.targets.items()) == [("c", 0), ("b", 2)] and not d.reverting
    # Every reclaimed byte: all of them, and that is a full reversion.
    d = plan(50 + 5 * LAYER)
    assert d.reverting and list(d.targets.items()) == [("c", 0), ("b", 0)]


def test_a_model_above_its_cap_gives_layers_back_when_memory_allows() -> None:
    # "b" became active with 10 layers remapped; its decode allows 2.
    b = model("b", active=True, alpha=10, t_transfer=0.01)
    others = [model("c", alpha=0)]
    c = controller(headroom=10**6)
    assert c.plan([b, *others], Pressure(demand=0, free=800), ["b", "c"]).targets == {"b": 2}
    # Short of memory, inactive "c" pays for it ...
    d = c.plan([b, *others], Pressure(demand=300, free=0), ["b", "c"])
    assert list(d.targets.items()) == [("b", 2), ("c", 11)]
    # ... and when nothing can, "b" keeps its layers for now.
    capped = [b, dataclasses.replace(others[0], alpha=20)]
    assert c.plan(capped, Pressure(demand=300, free=0), ["b", "c"]).targets == {}


def test_remap_then_revert_restores_exactly_the_reclaimed_layers() -> None:
    """Drive maps with the decisions while load rises and falls; at the end every frame
    taken back is one that was reclaimed, and every layer is resident in a frame."""
    names = ["a", "b", "c"]
    maps = {n: WeightMap.initial(40) for n in names}
    active = {"a"}
    c = controller(cap=0.5, headroom=100)
    reclaimed: dict[str, set[int]] = {n: set() for n in names}
    taken_back: dict[str, set[int]] = {n: set() for n in names}
    base = 200  # free KV bytes besides the reclaimed ones
    free = base
    for demand in [300, 900, 1800, 2500, 2500, 400, 0]:
        states = [
            dataclasses.replace(model(n, active=n in active), alpha=maps[n].alpha) for n in names
        ]
        d = c.plan(states, Pressure(demand=demand, free=free), names)
        for name, alpha in d.targets.items():
            wmap = maps[name]
            layout = select(40, alpha, 0.0, 1.0, keep=wmap.layout.streamed)
            t = transition(wmap, layout, sorted(wmap.reclaimed))
            reclaimed[name] |= set(t.reclaim)
            taken_back[name] |= set(t.take_back)
            maps[name] = t.after
        free = base + sum(m.alpha for m in maps.values()) * LAYER
    assert all(m.alpha == 0 for m in maps.values())
    assert taken_back == reclaimed and any(reclaimed.values())
    for wmap in maps.values():
        wmap.check()
        assert dict(wmap.frame_of).keys() == set(range(40))


def test_bad_orders_are_rejected() -> None:
    with pytest.raises(ValueError, match="start with 'free'"):
        controller(order=("inactive", "free"))
    with pytest.raises(ValueError, match="distinct"):
        controller(order=("free", "inactive", "inactive"))
