"""Forced remapping: layers lent whatever the pressure, kept lent, given back on demand."""

from __future__ import annotations

import pytest

from shunter.engine.config import RemapConfig
from shunter.engine.exec.forced_remap import EVERY_LAYER, ForcedRemap, forced_layers
from shunter.engine.remap.controller import ModelState, Pressure, RemapController

CALM = Pressure(demand=0, free=1 << 30)  # no deficit, a surplus far above any headroom


def state(name: str, *, alpha: int = 0, active: bool = True, layers: int = 8) -> ModelState:
    # Copies far slower than compute: the timings allow no remapping at all.
    return ModelState(
        name=name,
        num_layers=layers,
        frame_bytes=1 << 20,
        priority=0,
        active=active,
        t_last_active=0.0,
        alpha=alpha,
        t_transfer=1.0,
        t_decode=1e-3,
        t_prefill=1e-3,
    )


def forced(layers: int, *, inactive_only: bool = False) -> ForcedRemap:
    inner = RemapController(RemapConfig(enabled=True), headroom=1 << 20)
    return ForcedRemap(inner, layers, inactive_only=inactive_only)


def test_every_model_lends_the_forced_layers_without_pressure_or_room_in_its_timings() -> None:
    models = [state("a"), state("b", active=False), state("c", layers=3)]
    assert (
        RemapController(RemapConfig(enabled=True), headroom=0).plan(models, CALM, []).targets == {}
    )
    # c keeps two of its three layers.
    assert forced(2).plan(models, CALM, []).targets == {"a": 2, "b": 2, "c": 1}


def test_every_layer_means_all_but_two_and_two_layers_lend_none() -> None:
    assert [forced_layers(n, EVERY_LAYER) for n in (1, 2, 3, 8)] == [0, 0, 1, 6]
    assert forced_layers(8, 3) == 3
    models = [state("a"), state("b", layers=2), state("c", layers=5, active=False)]
    assert forced(EVERY_LAYER).plan(models, CALM, []).targets == {"a": 6, "c": 3}


def test_only_inactive_models_lend_when_asked() -> None:
    models = [state("a"), state("b", active=False)]
    assert forced(3, inactive_only=True).plan(models, CALM, []).targets == {"b": 3}


def test_forced_layers_stay_lent_through_a_surplus_and_come_back_when_released() -> None:
    models = [state("a", alpha=2), state("b", alpha=2, active=False)]
    controller = forced(2)
    # The surplus would revert everything; the forced layers stay.
    assert controller.plan(models, CALM, []).targets == {}
    controller.layers = 1
    decision = controller.plan(models, CALM, ["b", "a"])
    assert decision.targets == {"b": 1, "a": 1}
    controller.layers = 0
    decision = controller.plan(models, CALM, ["b", "a"])
    assert decision.targets == {"b": 0, "a": 0}


def test_a_deficit_still_takes_more_than_the_forced_layers() -> None:
    models = [state("a", alpha=1, active=False)]
    inner = RemapController(RemapConfig(enabled=True, cap_fraction=0.9), headroom=0)
    controller = ForcedRemap(inner, 1)
    short = Pressure(demand=3 << 20, free=0)
    # The cap (here the forced count: the timings allow none) bounds it.
    assert controller.plan(models, short, []).targets == {}
    models = [state("a", alpha=1, active=False), state("b", active=False)]
    assert controller.plan(models, short, []).targets == {"b": 1}


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ValueError, match="layers >= 0"):
        forced(-1)
