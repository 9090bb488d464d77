"""Frames across layout changes: growing never needs KV back, shrinking restores exactly
what was reclaimed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shunter.engine.plan import LayerLoad
from shunter.engine.remap.frames import WeightMap, transition
from shunter.engine.remap.layers import max_alpha, select


def test_first_remap_gives_away_all_but_the_slot_of_the_streamed_layers() -> None:
    start = WeightMap.initial(8)
    t = transition(start, select(8, 1, 1.0, 1.0), ())
    assert t.after.layout.streamed == (0, 4)
    assert t.take_back == () and t.loads == ()
    assert t.after.slots == (0,) and t.reclaim == (4,)
    assert t.after.slot_of(0) == t.after.slot_of(1) == 0
    t.after.check()


def test_growing_loads_layers_that_stop_streaming_and_takes_nothing_back() -> None:
    n = 40
    one = transition(WeightMap.initial(n), select(n, 3, 0.0, 1.0), ()).after
    assert one.layout.streamed == (0, 10, 20, 30)
    grown = transition(one, select(n, 4, 0.0, 1.0, keep=one.layout.streamed), ())
    assert grown.take_back == ()
    stopped = set(one.layout.streamed) - set(grown.after.layout.streamed)
    assert {load.layer for load in grown.loads} == stopped
    assert len(grown.after.reclaimed) == 4 and one.reclaimed <= grown.after.reclaimed
    grown.after.check()


def test_reverting_restores_exactly_the_reclaimed_frames() -> None:
    n = 40
    remapped = transition(WeightMap.initial(n), select(n, 6, 0.0, 1.0), ()).after
    back = transition(remapped, select(n, 0, 0.0, 1.0), sorted(remapped.reclaimed))
    assert set(back.take_back) == remapped.reclaimed
    assert sorted(load.layer for load in back.loads) == list(remapped.layout.streamed)
    assert back.reclaim == () and back.after.reclaimed == frozenset()
    assert back.after.layout.alpha == 0 and not back.after.slots
    back.after.check()


def test_shrinking_takes_back_the_cheapest_frames_first() -> None:
    n = 16
    remapped = transition(WeightMap.initial(n), select(n, 5, 0.0, 1.0), ()).after
    cheapest_last = sorted(remapped.reclaimed, reverse=True)
    t = transition(remapped, select(n, 3, 0.0, 1.0), cheapest_last)
    assert t.take_back == tuple(cheapest_last[: len(t.take_back)])
    t.after.check()
    with pytest.raises(ValueError, match="lacks reclaimed frames"):
        transition(remapped, select(n, 0, 0.0, 1.0), ())


@given(
    n=st.integers(3, 48),
    alphas=st.lists(st.integers(0, 46), min_size=1, max_size=8),
    ratio=st.sampled_from([0.0, 1.0, 3.2]),
)
def test_any_sequence_of_layouts_keeps_frames_a_partition(
    n: int, alphas: list[int], ratio: float
) -> None:
    wmap = WeightMap.initial(n)
    for alpha in alphas:
        alpha = min(alpha, max_alpha(n, ratio, 1.0, n))
        layout = select(n, alpha, ratio, 1.0, keep=wmap.layout.streamed)
        t = transition(wmap, layout, sorted(wmap.reclaimed))
        # Frames reclaimed minus frames taken back is exactly the change in alpha.
        assert len(t.reclaim) - len(t.take_back) == layout.alpha - wmap.alpha
        assert all(isinstance(load, LayerLoad) for load in t.loads)
        assert {load.frame for load in t.loads}.isdisjoint(t.reclaim)
        wmap = t.after
        wmap.check()
