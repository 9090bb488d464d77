"""The quantum follows the measured switch cost, within its bounds."""

from __future__ import annotations

import pytest

from shunter.engine.sched.turn_length import EWMA_WEIGHT, SWITCH_COST_FACTOR, TurnLength


def test_unmeasured_the_quantum_is_the_minimum() -> None:
    assert TurnLength(0.5).quantum_s == 0.5


def test_a_switch_costs_the_wait_before_the_first_step_and_the_waits_until_settled() -> None:
    turns = TurnLength(0.1)
    assert not turns.is_measuring
    turns.switched(10.0)
    assert turns.is_measuring
    # A step without the holder is not its business.
    turns.observe(holder_ran=False, now=10.3, duration_s=0.3, compute_s=0.0)
    # First step starts at 10.3 (0.3 s after the switch) and waits 0.15 s for layers.
    turns.observe(holder_ran=True, now=10.5, duration_s=0.2, compute_s=0.05)
    assert turns.t_switch_cost is None  # not settled yet
    turns.observe(holder_ran=True, now=10.6, duration_s=0.1, compute_s=0.04)  # waits 0.06
    turns.observe(holder_ran=True, now=10.64, duration_s=0.04, compute_s=0.04)  # settled
    assert turns.t_switch_cost == pytest.approx(0.3 + 0.15 + 0.06)
    assert not turns.is_measuring
    assert turns.quantum_s == pytest.approx(SWITCH_COST_FACTOR * 0.51)
    # Later steps do not count; the next switch moves the average.
    turns.observe(holder_ran=True, now=11.0, duration_s=0.3, compute_s=0.0)
    turns.switched(12.0)
    turns.observe(holder_ran=True, now=12.04, duration_s=0.04, compute_s=0.04)
    assert turns.t_switch_cost == pytest.approx((1 - EWMA_WEIGHT) * 0.51)


def test_the_quantum_stays_within_its_bounds() -> None:
    turns = TurnLength(0.5, max_quantum_s=2.5)
    turns.switched(0.0)
    turns.observe(holder_ran=True, now=5.0, duration_s=0.1, compute_s=None)  # 4.9 s gap
    assert turns.quantum_s == 2.5
    turns.t_switch_cost = 0.01
    assert turns.quantum_s == 0.5  # never under the minimum
    turns.max_quantum_s = 0.1
    assert turns.quantum_s == 0.5  # nor the bound under it


def test_a_switch_the_holder_never_ran_in_is_not_a_measure() -> None:
    turns = TurnLength(0.5)
    turns.switched(0.0)
    turns.switched(1.0)
    assert turns.t_switch_cost is None


def test_a_negative_minimum_is_refused() -> None:
    with pytest.raises(ValueError, match="min_quantum_s"):
        TurnLength(-1.0)
