"""A model's pass cost learned per size: flat where weight reads set it, rising past
the knee, never decreasing, extrapolated along its last segment."""

from __future__ import annotations

import math

import pytest

from shunter.engine.sched.step_cost import CostCurve


def roofline_s(tokens: int) -> float:
    """A pass that reads 10 ms of weights, or computes 0.04 ms a token past 250."""
    return max(0.010, 0.00004 * tokens)


def test_before_any_pass_the_cost_is_unknown() -> None:
    curve = CostCurve(0.1)
    assert curve.seconds(10) == math.inf and curve.least_s == 0.0
    assert curve.seconds(0) == 0.0


def test_a_roofline_is_flat_to_its_knee_and_rises_past_it() -> None:
    curve = CostCurve(0.1)
    for n in [1, 3, 30, 200, 600, 1200]:
        curve.observe(n, roofline_s(n))
    assert curve.least_s == pytest.approx(0.010)
    assert curve.seconds(100) == pytest.approx(0.010)
    assert curve.seconds(800) == pytest.approx(0.032)  # between the 600 and 1200 passes
    # Beyond the largest pass, along the last segment's slope.
    assert curve.seconds(2000) == pytest.approx(roofline_s(2000))
    assert curve.seconds(2401) == math.inf


def test_with_one_size_measured_the_whole_cost_counts_per_token() -> None:
    curve = CostCurve(0.1)
    curve.observe(4, 0.010)
    assert curve.seconds(2) == pytest.approx(0.010)
    assert curve.seconds(8) == pytest.approx(0.020)


def test_noise_never_makes_a_larger_pass_cheaper() -> None:
    curve = CostCurve(1.0)
    curve.observe(8, 0.012)
    curve.observe(64, 0.010)  # a quieter moment
    curve.observe(512, 0.020)
    assert curve.seconds(64) == pytest.approx(0.012)
    sizes = range(1, 2000, 37)
    costs = [curve.seconds(n) for n in sizes]
    assert costs == sorted(costs)


def test_each_size_follows_its_own_recent_passes() -> None:
    curve = CostCurve(0.5)
    for _ in range(20):
        curve.observe(100, 0.010)
    for _ in range(20):
        curve.observe(100, 0.030)  # the device slowed down
    assert curve.seconds(100) == pytest.approx(0.030, rel=1e-4)
    curve.observe(0, 5.0)  # nothing batched: says nothing
    curve.observe(10, -1.0)
    assert curve.seconds(100) == pytest.approx(0.030, rel=1e-4)


def test_past_one_doubling_of_the_largest_pass_the_cost_is_unknown() -> None:
    curve = CostCurve(0.1)
    for n in [1, 2, 5]:
        curve.observe(n, 0.010)  # flat so far: decodes and a short prompt
    assert curve.seconds(10) == pytest.approx(0.010)
    assert curve.seconds(11) == math.inf  # not a 2,000-token prompt at the flat cost
