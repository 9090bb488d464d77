"""Generated workloads: a function of their seed, the shipped samples, and what sweeps
and scenarios generate."""

from __future__ import annotations

import dataclasses
import random

import pytest

from shunter.engine.workload import DATA_DIR
from shunter.engine.workload.arrivals import (
    AZURE_CONV_CV,
)
from shunter.engine.workload.generate import (
    SAMPLE_TRACES,
    lengths_from,
    sample_trace,
    synthetic_workload,
)
from shunter.engine.workload.lengths import (
    WORKLOADS,
    sharegpt_like,
)
from shunter.engine.workload.traces import read_trace


def test_same_seed_same_workload_other_seed_other_workload() -> None:
    a = synthetic_workload(rate=8, duration_s=30, model="m", seed=1)
    b = synthetic_workload(rate=8, duration_s=30, model="m", seed=1)
    c = synthetic_workload(rate=8, duration_s=30, model="m", seed=2)
    assert a == b
    assert a != c
    assert len(a) == 240


def test_sharegpt_stays_the_default_workload() -> None:
    assert lengths_from(None) is sharegpt_like is WORKLOADS["sharegpt"].lengths
    rng = random.Random(0)
    assert [sharegpt_like(rng) for _ in range(3)] == [(81, 212), (197, 186), (402, 44)]
    default = synthetic_workload(rate=4, duration_s=50, model="llama-3-8b", seed=0)
    assert default == sample_trace("sharegpt")


@pytest.mark.parametrize("name", list(SAMPLE_TRACES))
def test_shipped_sample_traces_are_what_the_generator_makes(name: str) -> None:
    path = DATA_DIR / f"{name}.jsonl"
    assert read_trace(path) == sample_trace(name), (
        f"{path} drifted from the generator: if intended, rewrite it with "
        f"write_trace(DATA_DIR / '{name}.jsonl', sample_trace('{name}'))"
    )
    assert len(sample_trace(name)) == 200


def test_every_shipped_trace_is_a_named_sample() -> None:
    assert {p.stem for p in DATA_DIR.glob("*.jsonl")} == set(SAMPLE_TRACES)
    assert set(SAMPLE_TRACES) <= set(WORKLOADS)


def test_sweeps_and_scenarios_generate_the_named_workload_and_arrivals() -> None:
    from shunter.engine.sim.mix import mixed_workload
    from shunter.engine.sim.scenario import get_scenario
    from shunter.engine.sim.scenario_sweep import ScenarioSpec
    from shunter.engine.sim.sweep import SweepSpec

    spec = SweepSpec("llama-3-8b", "h100", ("fcfs",), (4.0,), 50.0, 5.0, 0.1)
    for name in SAMPLE_TRACES:
        named = dataclasses.replace(spec, workload_name=name, arrivals=SAMPLE_TRACES[name][1])
        assert named.workload(4.0, named.lengths()) == sample_trace(name)
    gamma = dataclasses.replace(spec, arrivals="gamma:2")
    cv = dataclasses.replace(spec, cv=2.0)
    assert gamma.workload(4.0, gamma.lengths()) == cv.workload(4.0, cv.lengths())
    with pytest.raises(ValueError, match="give one"):
        dataclasses.replace(spec, cv=2.0, arrivals="azure-code")

    scenario = ScenarioSpec(
        "c2", ("spatial",), ("none",), (4.0,), duration_s=20.0, arrivals="azure-conv",
        workload_name="lmsys",
    )  # fmt: skip
    loads = get_scenario("c2").loads(
        "spatial", 4.0, window_s=30.0, cv=AZURE_CONV_CV, lengths=WORKLOADS["lmsys"].lengths
    )
    assert scenario.workload("spatial", 4.0) == mixed_workload(loads, duration_s=20.0, seed=0)
