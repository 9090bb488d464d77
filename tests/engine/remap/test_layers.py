"""Layer selection: uniform spacing, one slot or two, and how many layers fit."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shunter.engine.remap.layers import Layout, max_alpha, num_slots, select, uniform_layers


def circular_gaps(layers: tuple[int, ...], n: int) -> list[int]:
    return [(b - a) % n or n for a, b in itertools.pairwise((*layers, layers[0]))]


@pytest.mark.parametrize("n", range(2, 81))
def test_uniform_spacing_for_every_n_and_alpha(n: int) -> None:
    # T_T = 0 makes every alpha feasible: every (n, alpha) with a resident layer left.
    for alpha in range(1, n - 1):
        layout = select(n, alpha, 0.0, 1.0)
        assert layout.m == alpha + 1 and layout.num_slots == 1
        gaps = circular_gaps(layout.streamed, n)
        assert max(gaps) - min(gaps) <= 1, (n, alpha, layout.streamed)
        assert layout.resident, "never all layers of a model"


@given(n=st.integers(2, 200), m=st.integers(1, 200), offset=st.integers(0, 400))
def test_every_rotation_is_uniform(n: int, m: int, offset: int) -> None:
    m = min(m, n)
    layers = uniform_layers(n, m, offset)
    assert len(set(layers)) == m
    gaps = circular_gaps(layers, n)
    assert sum(gaps) == n and max(gaps) - min(gaps) <= 1


def test_the_papers_eight_layer_example_pairs_layers_1_and_5() -> None:
    # Fig. 7, phase 2: one layer remapped from Model-C's 8 layers: layers 1 and 5
    # (1-based) share a slot.
    layout = select(8, 1, 1.0, 1.0)
    assert layout.streamed == (0, 4) and layout.num_slots == 1


def test_n40_switches_to_double_buffering_from_alpha_9() -> None:
    # §5.4: for n = 40 and fixed T_T, T_c, Eq. 4 keeps m = alpha + 1 up to alpha = 8
    # and Eq. 5 takes over from alpha = 9 when 3 < T_T / T_c <= 31 / 9.
    n, t_c = 40, 1.0
    t_t = 3.2
    assert all(num_slots(n, a, t_t, t_c) == 1 for a in range(1, 9))
    assert t_t * 10 > t_c * 30 and t_t * 11 <= t_c * n  # the inequalities at alpha = 9
    assert num_slots(n, 9, t_t, t_c) == 2
    assert num_slots(n, 10, t_t, t_c) == 2
    assert num_slots(n, 11, t_t, t_c) is None  # 3.2 * 13 > 40: lower alpha
    assert max_alpha(n, t_t, t_c, cap=n) == 10
    assert select(n, 9, t_t, t_c).m == 11


@given(
    n=st.integers(2, 120),
    ratio=st.floats(0.0, 50.0, allow_nan=False),
    cap=st.integers(0, 120),
)
def test_max_alpha_is_the_largest_feasible_alpha_and_never_the_whole_model(
    n: int, ratio: float, cap: int
) -> None:
    best = max_alpha(n, ratio, 1.0, cap)
    assert 0 <= best <= min(cap, n - 2) or best == 0
    for alpha in range(1, best + 1):
        slots = num_slots(n, alpha, ratio, 1.0)
        assert slots is not None and alpha + slots < n
    if best < min(cap, n - 2):
        assert num_slots(n, best + 1, ratio, 1.0) is None


def test_select_keeps_the_streamed_layers_it_can() -> None:
    before = select(40, 3, 0.0, 1.0)
    assert before.streamed == (0, 10, 20, 30)
    shifted = select(40, 3, 0.0, 1.0, keep=(5, 15, 25, 35))
    assert shifted.streamed == (5, 15, 25, 35)
    grown = select(40, 7, 0.0, 1.0, keep=before.streamed)
    assert set(before.streamed) <= set(grown.streamed)  # 8 layers, every 5th


def test_infeasible_alpha_gets_two_slots_and_malformed_layouts_are_rejected() -> None:
    assert num_slots(40, 30, 10.0, 1.0) is None
    assert select(40, 30, 10.0, 1.0).num_slots == 2
    assert select(40, 38, 10.0, 1.0).num_slots == 1
    with pytest.raises(ValueError, match="no layer resident"):
        select(40, 39, 10.0, 1.0)
    with pytest.raises(ValueError, match="resident"):
        Layout(4, 3, (0, 1, 2, 3))
    with pytest.raises(ValueError, match="slots"):
        Layout(10, 1, (0, 3, 6, 9))
