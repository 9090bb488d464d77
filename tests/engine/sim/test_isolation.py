"""The simulated isolation bench: a victim tenant alone and beside a 10x aggressor."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest

from shunter.engine.benchfigure import split_report
from shunter.engine.sim import isolation
from shunter.engine.sim.isolation import (
    BATCH,
    HEADER,
    INTERACTIVE,
    Comparison,
    IsolationSpec,
    aggressor_workload,
    bench_isolation_sim,
    compare,
    isolation_config,
    p99_ratio,
    victim_workload,
)

# c1 at its default victim rate, 0.5 req/s: 6 victim and 60 aggressor requests.
SPEC = IsolationSpec(scenarios=("c1",), variants=("vllm",), duration_s=12.0)


@pytest.fixture(scope="module")
def comparison() -> Comparison:
    return compare(SPEC, "c1", "vllm")


@pytest.fixture(scope="module")
def unbounded() -> Comparison:
    """The same without a step target: the simulator's fixed token budget alone."""
    return compare(dataclasses.replace(SPEC, step_target_s=None), "c1", "vllm")


def test_the_victim_runs_the_same_requests_alone_and_beside_a_tenfold_aggressor(
    comparison: Comparison,
) -> None:
    assert comparison.alone.num_requests == comparison.beside.num_requests == 6
    assert comparison.aggressor.num_requests == 60
    assert comparison.offered == 5.0
    assert comparison.aggressor.num_succeeded == 60


def test_the_aggressor_slows_the_victim_and_the_ratios_are_against_alone(
    unbounded: Comparison,
) -> None:
    alone, beside = unbounded.alone, unbounded.beside
    # Alone, the small model meets the interactive class for every request.
    assert alone.slo_attainment == 1.0
    assert alone.ttft_s.p99 is not None and beside.ttft_s.p99 is not None
    assert unbounded.ttft_ratio == pytest.approx(beside.ttft_s.p99 / alone.ttft_s.p99)
    assert alone.itl_s.p99 is not None and beside.itl_s.p99 is not None
    assert unbounded.tbt_ratio == pytest.approx(beside.itl_s.p99 / alone.itl_s.p99)
    # Without a step target the aggressor's 1,469-token prefills share the victim's steps.
    assert unbounded.ttft_ratio > 3
    assert unbounded.tbt_ratio > 3


def test_the_engines_step_target_keeps_the_victims_ttft_within_the_target() -> None:
    # Each step of the two models costs about 26 ms of weight reads and host work, over
    # the 25 ms target: the step budget lets the aggressor's chunks grow to what those
    # reads pay for (``StepBudget.tokens_for``), not the least chunk, so the aggressor is
    # served in full, and the victim's first token comes within 1.5x of alone. 30 s:
    # over the first seconds each model's chunks still double up to their cost's knee.
    assert SPEC.step_target_s == pytest.approx(0.025)
    run = compare(dataclasses.replace(SPEC, duration_s=30.0), "c1", "vllm")
    assert run.ttft_ratio <= isolation.TARGET_TTFT_RATIO
    assert run.beside.slo_attainment == 1.0
    assert run.aggressor.num_succeeded == run.aggressor.num_requests == 150
    assert run.aggressor.slo_attainment == 1.0


def test_variants_map_to_the_scenarios_and_tenants_carry_their_slo_classes() -> None:
    vllm, combined = isolation_config("c1", "vllm"), isolation_config("c1", "combined+")
    assert (vllm.scheduler.policy, vllm.remap.enabled) == ("fcfs", False)
    assert (combined.scheduler.policy, combined.remap.enabled) == ("lvf+", True)
    shed = isolation_config("c1", "combined+shed")
    assert (shed.scheduler.policy, shed.remap.enabled) == ("lvf+shed", True)
    # Run only when named: the default is the six the issue compares.
    assert "lvf+shed" not in IsolationSpec().variants
    classes = {t.model: t.slo for t in vllm.tenants}
    assert classes["llama-3-8b"] is INTERACTIVE
    assert classes["llama-2-13b"] is BATCH
    assert classes["opt-13b"] not in (INTERACTIVE, BATCH)
    assert {t.sharing for t in vllm.tenants} == {"spatial"}
    assert vllm.scheduler.step_target_s is None  # unless asked: ``IsolationSpec`` asks
    stepped = isolation_config("c1", "vllm", step_target_s=0.025)
    assert stepped.scheduler.step_target_s == 0.025


def test_the_aggressor_sends_ten_times_the_rate_of_long_prompts() -> None:
    victim = victim_workload("v", 2.0, 50.0, seed=3)
    aggressor = aggressor_workload("a", 2.0, 50.0, seed=3)
    assert len(victim) == 100 and len(aggressor) == 1000
    assert {(r.prompt_tokens, r.output_tokens) for r in aggressor} == {(1469, 13)}
    assert statistics.mean(r.prompt_tokens for r in victim) < 1469 / 4
    assert aggressor[0].t != victim[0].t  # seeded apart


def test_the_report_prints_a_row_per_variant_and_holds_each_to_the_targets(
    unbounded: Comparison, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake(spec: IsolationSpec, scenario: str, variant: str) -> Comparison:
        return dataclasses.replace(unbounded, variant=variant)

    monkeypatch.setattr(isolation, "compare", fake)
    spec = IsolationSpec(scenarios=("c2",), variants=("vllm", "combined+"))
    lines, figures = split_report(bench_isolation_sim(spec))
    assert lines[0].startswith("SIMULATED: scenario c2")
    assert "victim opt-6.7b" in lines[0] and "at 0.2 req/s" in lines[0]
    assert lines[1] == HEADER
    rows = lines[2:4]
    assert [row.split()[0] for row in rows] == ["vllm", "combined+"]
    assert [(f.name, f.direction, f.target) for f in figures] == [
        ("isolation.sim.c2.vllm.ttft_p99_ratio", "<=", 1.5),
        ("isolation.sim.c2.vllm.attainment", ">=", 95.0),
        ("isolation.sim.c2.combined+.ttft_p99_ratio", "<=", 1.5),
        ("isolation.sim.c2.combined+.attainment", ">=", 95.0),
    ]
    cells = rows[0].split()
    ratio, attainment = figures[:2]
    assert cells[3] == f"{ratio.value:.2f}x" and cells[4] == "MISSED"
    assert attainment.value == 100.0 and cells[9:11] == ["100.0%", "ok"]
    assert lines[-1].startswith("targets:")


def test_a_ratio_without_a_baseline_is_not_a_number() -> None:
    assert p99_ratio(0.3, 0.1) == pytest.approx(3.0)
    assert math.isnan(p99_ratio(None, 0.1))
    assert math.isnan(p99_ratio(0.3, None))
    assert math.isnan(p99_ratio(0.3, 0.0))


def test_unknown_scenarios_variants_and_bad_numbers_are_refused() -> None:
    with pytest.raises(ValueError, match="c3"):
        IsolationSpec(scenarios=("c3",))
    with pytest.raises(ValueError, match="none"):
        IsolationSpec(variants=("none",))  # the scenario's name; the bench says vllm
    with pytest.raises(ValueError, match="rate"):
        IsolationSpec(rate=0.0)
    with pytest.raises(ValueError, match="step target"):
        IsolationSpec(step_target_s=-1.0)
