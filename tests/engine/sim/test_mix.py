"""Multi-model workloads: per-model rates, on/off schedules, seeded per model."""

from __future__ import annotations

import pytest

from shunter.engine.sim.mix import ModelLoad, OnOff, mixed_workload
from shunter.engine.workload.lengths import fixed_lengths


def test_on_off_windows_and_on_time() -> None:
    on = OnOff(period_s=30.0, on_s=10.0, phase_s=10.0)
    assert not on.is_on(5.0) and on.is_on(10.0) and on.is_on(19.9) and not on.is_on(20.0)
    assert on.is_on(40.0) and not on.is_on(55.0)
    assert on.on_time(120.0) == pytest.approx(40.0)  # windows at 10, 40, 70, 100
    assert on.wall_time(0.0) == 10.0 and on.wall_time(15.0) == pytest.approx(45.0)
    with pytest.raises(ValueError):
        OnOff(period_s=5.0, on_s=10.0)


def test_each_model_gets_its_rate_only_while_on() -> None:
    lengths = fixed_lengths(8, 8)
    loads = [
        ModelLoad("a", 20.0, lengths=lengths),
        ModelLoad("b", 5.0, cv=2.0, schedule=OnOff(40.0, 20.0, 20.0), lengths=lengths),
    ]
    requests = mixed_workload(loads, duration_s=200.0, seed=1)
    a = [r for r in requests if r.model == "a"]
    b = [r for r in requests if r.model == "b"]
    assert len(a) == pytest.approx(20 * 200, rel=0.01)
    assert len(b) == pytest.approx(5 * 100, rel=0.1)  # bursty: the count varies more
    assert all(loads[1].schedule and loads[1].schedule.is_on(r.t) for r in b)
    assert [r.t for r in requests] == sorted(r.t for r in requests)
    assert all(r.t < 200.0 for r in requests)


def test_same_seed_same_requests_and_models_draw_independently() -> None:
    one = [ModelLoad("a", 3.0)]
    two = [ModelLoad("a", 3.0), ModelLoad("b", 7.0)]
    first = mixed_workload(one, duration_s=30.0, seed=4)
    assert first == mixed_workload(one, duration_s=30.0, seed=4)
    assert first == [r for r in mixed_workload(two, duration_s=30.0, seed=4) if r.model == "a"]
    assert first != mixed_workload(one, duration_s=30.0, seed=5)
