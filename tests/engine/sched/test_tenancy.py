"""Tenancy: spatial models run whenever they have work, temporal ones take turns."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from shunter.engine.config import SloSpec, TenantSpec
from shunter.engine.sched.tenancy import Tenancy, Urgency


def tenancy(quantum: float = 1.0) -> Tenancy:
    return Tenancy(
        [
            TenantSpec("s", sharing="spatial"),
            TenantSpec("t1", sharing="temporal", priority=1),
            TenantSpec("t2", sharing="temporal"),
            TenantSpec("t3", sharing="temporal"),
        ],
        min_quantum_s=quantum,
    )


def urgent(lags: Mapping[str, float | tuple[bool, float]]) -> Urgency:
    """Each model's urgency: a number is that of a model with a request still in time."""
    return lambda m: (True, u) if isinstance(u := lags[m], float) else u


def step(t: Tenancy, now: float, lags: Mapping[str, float | tuple[bool, float]]) -> list[str]:
    """``lags`` lists the models with work and their urgency (larger goes first)."""
    return t.executing(now, lags.__contains__, urgent(lags))


def test_spatial_models_run_in_every_step_they_have_work() -> None:
    t = tenancy()
    assert step(t, 0.0, {"s": 0.0}) == ["s"]
    assert step(t, 0.1, {}) == []
    assert step(t, 0.2, {"s": -1.0, "t1": 0.0}) == ["s", "t1"]
    assert t.is_active("s") and t.is_active("t1") and not t.is_active("t2")


def test_the_turn_is_held_for_the_minimum_quantum_then_goes_to_the_most_urgent() -> None:
    t = tenancy(quantum=1.0)
    assert step(t, 0.0, {"t2": 0.0}) == ["t2"]
    # Within the quantum the holder keeps the turn, however much others lag.
    assert step(t, 0.5, {"t2": -0.5, "t3": 9.0}) == ["t2"]
    # After it, the model whose most urgent request is closest to missing its SLO.
    assert step(t, 1.0, {"t2": -0.5, "t3": 9.0}) == ["t3"]
    assert t.holder == "t3" and t.num_switches == 1
    assert not t.is_active("t2")


def test_a_model_with_a_request_in_time_goes_before_models_whose_requests_are_all_late() -> None:
    t = tenancy(quantum=0.0)
    step(t, 0.0, {"t2": 0.0})
    # t3's requests are all late, by far more than t2's most urgent one is near its
    # deadline: t2 keeps the turn, and t1 ranks after t2 for what comes next.
    assert step(t, 1.0, {"t2": -0.5, "t3": (False, 40.0)}) == ["t2"]
    lags = {"t3": (False, 40.0), "t1": (True, -3.0)}
    assert t.run_next(lags.__contains__, urgent(lags)) == ["s", "t2", "t1", "t3"]
    # Once t2's requests are late too, the latest go first.
    assert step(t, 2.0, {"t2": (False, 2.0), "t3": (False, 40.0)}) == ["t3"]


def test_a_model_whose_requests_are_all_late_gets_the_turn_once_it_waited_its_ttft() -> None:
    slo = SloSpec("interactive", ttft_s=5.0, tbt_s=0.1)
    t = Tenancy(
        [
            TenantSpec("top", sharing="temporal", priority=1, slo=slo),
            TenantSpec("a", sharing="temporal", slo=slo),
            TenantSpec("b", sharing="temporal", slo=slo),
            TenantSpec("free", sharing="temporal"),  # no SLO class: no bound
        ],
        min_quantum_s=1.0,
    )
    late = (False, 40.0)
    assert step(t, 0.0, {"a": 0.0}) == ["a"]
    # a keeps a request in time: b, all late, waits from 1.0 ...
    assert step(t, 1.0, {"a": 0.0, "b": late}) == ["a"]
    assert step(t, 5.9, {"a": 0.0, "b": late}) == ["a"]
    # ... until it has waited its TTFT target; then it holds the turn for a quantum.
    assert step(t, 6.0, {"a": 0.0, "b": late}) == ["b"]
    assert step(t, 6.9, {"a": -1.0, "b": late}) == ["b"]
    assert step(t, 7.0, {"a": -1.0, "b": late}) == ["a"]
    # Waiting is counted afresh from when it lost the turn, and only while it has work.
    assert step(t, 8.0, {"a": 0.0}) == ["a"]
    assert step(t, 9.0, {"a": 0.0, "b": late}) == ["a"]
    assert step(t, 13.9, {"a": 0.0, "b": late}) == ["a"]
    assert step(t, 14.0, {"a": 0.0, "b": late}) == ["b"]
    # A model with a request in time is not owed the turn by its wait (its urgency
    # grows as it waits), nor is one without a target, nor does a wait outrank priority.
    assert step(t, 15.0, {"a": -9.0, "b": 0.0, "free": late}) == ["b"]
    assert step(t, 25.0, {"a": -9.0, "b": 0.0, "free": late}) == ["b"]  # both waited 10 s
    assert step(t, 26.0, {"top": 1.0, "b": 0.0}) == ["top"]
    assert step(t, 40.0, {"top": 1.0, "b": late}) == ["top"]
    assert t.num_switches == 4


def test_a_higher_priority_takes_the_turn_first_whatever_the_others_lag() -> None:
    t = tenancy(quantum=1.0)
    assert step(t, 0.0, {"t2": 0.0}) == ["t2"]
    # After the quantum t1 (priority 1) takes it from t2 and t3, which lag far more.
    assert step(t, 1.0, {"t1": -5.0, "t2": 3.0, "t3": 9.0}) == ["t1"]
    # And keeps it while it has work: the others' lag does not outrank its priority.
    assert step(t, 9.0, {"t1": -5.0, "t2": 30.0, "t3": 90.0}) == ["t1"]
    assert t.num_switches == 1


def test_the_holder_keeps_the_turn_when_it_lags_most_or_ties() -> None:
    t = tenancy(quantum=0.0)
    step(t, 0.0, {"t2": 1.0})
    assert step(t, 5.0, {"t2": 4.0, "t3": 4.0}) == ["t2"]
    assert step(t, 6.0, {"t2": 5.0, "t3": 1.0}) == ["t2"]
    assert t.num_switches == 0


def test_a_holder_without_work_gives_the_turn_up_at_once() -> None:
    t = tenancy(quantum=10.0)
    step(t, 0.0, {"t1": 0.0})
    assert step(t, 0.1, {"t2": 0.0, "t3": 0.5}) == ["t3"]
    # Nobody with work: the idle holder keeps no turn, so it is inactive (its layers
    # may be lent); taking the turn back is no switch.
    assert step(t, 0.2, {}) == []
    assert t.holder is None and not t.is_active("t3")
    assert step(t, 0.3, {"t3": 0.0}) == ["t3"]
    assert t.num_switches == 1


def test_a_lone_temporal_model_is_inactive_while_idle() -> None:
    t = Tenancy([TenantSpec("only", sharing="temporal")], min_quantum_s=0.5)
    assert step(t, 0.0, {"only": 0.0}) == ["only"] and t.is_active("only")
    assert step(t, 0.1, {}) == [] and not t.is_active("only")
    assert step(t, 0.2, {"only": 0.0}) == ["only"] and t.is_active("only")
    assert t.num_switches == 0


def test_a_holder_that_cannot_run_passes_the_turn_to_a_model_that_has_not_failed_too() -> None:
    t = tenancy(quantum=10.0)
    lags = {"t1": 5.0, "t2": 4.0, "t3": 1.0}  # t3 lags least: its requests are running
    step(t, 0.0, lags)
    assert t.holder == "t1"
    # t1 cannot run: the turn goes to t2, which cannot run either; not back to t1 but on
    # to t3, whose running requests hold the memory the others wait for.
    assert t.pass_turn(0.0, lags.__contains__, urgent(lags)) and t.holder == "t2"
    assert t.pass_turn(0.0, lags.__contains__, urgent(lags)) and t.holder == "t3"
    # When no model is left to try, the holder keeps the turn until memory changes.
    assert not t.pass_turn(0.0, lags.__contains__, urgent(lags)) and t.holder == "t3"
    t.memory_changed()
    assert t.pass_turn(0.0, lags.__contains__, urgent(lags)) and t.holder == "t1"
    assert t.num_switches == 3


def test_run_next_ranks_active_then_lagging_then_idle_by_priority_and_round_robin() -> None:
    t = tenancy(quantum=0.0)
    step(t, 0.0, {"t2": 0.0})
    step(t, 1.0, {"t3": 0.0})  # t2 ran at 0.0, t3 holds the turn since 1.0
    lags = {"t2": 2.0, "t1": 5.0}
    assert t.run_next(lags.__contains__, urgent(lags)) == ["s", "t3", "t1", "t2"]
    # Idle models of equal priority: the least recently active first (s never ran).
    assert t.run_next(lambda m: False, lambda m: (True, 0.0)) == ["s", "t3", "t1", "t2"]
    idle = tenancy(quantum=0.0)
    step(idle, 0.0, {"t2": 0.0})
    step(idle, 1.0, {"t3": 0.0})
    step(idle, 2.0, {"t1": 0.0})
    assert idle.run_next(lambda m: False, lambda m: (True, 0.0)) == ["t1", "s", "t2", "t3"]


def test_bad_tenants_are_rejected() -> None:
    with pytest.raises(ValueError, match="sharing"):
        TenantSpec("x", sharing="both")
    with pytest.raises(ValueError, match="kv_floor"):
        TenantSpec("x", kv_floor=10, kv_ceiling=5)
    with pytest.raises(ValueError, match="one tenant per model"):
        Tenancy([TenantSpec("x"), TenantSpec("x")], min_quantum_s=0.0)


def test_set_tenants_keeps_the_turn_history_and_counts_and_drops_a_holder_gone_spatial() -> None:
    t = tenancy(quantum=0.0)
    step(t, 0.0, {"t2": 0.0})
    step(t, 1.0, {"t2": 0.0, "t3": 5.0})
    assert t.holder == "t3" and t.num_switches == 1
    history = dict(t.t_last_active)
    # t2 turns spatial, s temporal; t3 stays temporal and keeps the turn.
    t.set_tenants(
        [
            TenantSpec("s", sharing="temporal", priority=3),
            TenantSpec("t1", sharing="temporal", priority=1),
            TenantSpec("t2", sharing="spatial"),
            TenantSpec("t3", sharing="temporal"),
        ]
    )
    assert t.holder == "t3" and t.num_switches == 1 and t.t_last_active == history
    assert t.spatial == ["t2"] and t.temporal == ["s", "t1", "t3"]
    assert t.tenants["s"].priority == 3
    assert t.is_active("t2") and not t.is_active("s")
    # The next step runs the new spatial model beside the holder, not the new temporal one.
    assert step(t, 2.0, {"t2": 0.0, "t3": 1.0}) == ["t2", "t3"]

    # The holder turns spatial: nobody holds the turn until the next step hands it on.
    t.set_tenants(
        [
            TenantSpec("s", sharing="temporal"),
            TenantSpec("t1", sharing="temporal"),
            TenantSpec("t2", sharing="spatial"),
            TenantSpec("t3", sharing="spatial"),
        ]
    )
    assert t.holder is None and t.is_active("t3")
    assert step(t, 3.0, {"s": 2.0, "t1": 1.0, "t3": 0.0}) == ["t3", "s"]
    assert t.holder == "s" and t.num_switches == 1  # handing on a vacant turn is no switch


def test_set_tenants_wants_every_model_once() -> None:
    t = tenancy()
    with pytest.raises(ValueError, match="one tenant per model"):
        t.set_tenants([TenantSpec("s"), TenantSpec("s")])
    with pytest.raises(ValueError, match="wanted"):
        t.set_tenants([TenantSpec("s"), TenantSpec("t1"), TenantSpec("t2")])
    with pytest.raises(ValueError, match="wanted"):
        t.set_tenants([TenantSpec(m) for m in ("s", "t1", "t2", "t3", "x")])
    assert t.temporal == ["t1", "t2", "t3"]  # unchanged


def test_the_quantum_grows_with_the_switch_cost_up_to_what_ttft_allows() -> None:
    slo = SloSpec("interactive", ttft_s=4.0, tbt_s=0.1)
    t = Tenancy(
        [TenantSpec("a", sharing="temporal", slo=slo), TenantSpec("b", sharing="temporal")],
        min_quantum_s=0.5,
    )
    assert t.quantum_s == 0.5 and t.turn_length.max_quantum_s == 2.0  # 4 s over 2 models
    assert step(t, 0.0, {"a": 0.0}) == ["a"]
    assert step(t, 0.5, {"a": 0.0, "b": 1.0}) == ["b"]  # a switch at 0.5
    # b's first step starts 0.2 s after the switch and waits 0.2 s for its layers.
    t.observe(["b"], now=1.1, duration_s=0.4, compute_s=0.2)
    t.observe(["b"], now=1.2, duration_s=0.1, compute_s=0.1)
    assert t.turn_length.t_switch_cost == pytest.approx(0.4)
    assert t.quantum_s == pytest.approx(1.6)
    # b keeps the turn for 1.6 s now, not the configured 0.5.
    assert step(t, 1.5, {"a": 5.0, "b": 0.0}) == ["b"]
    assert step(t, 2.2, {"a": 5.0, "b": 0.0}) == ["a"]
