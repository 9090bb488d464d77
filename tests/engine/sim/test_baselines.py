"""Baselines as the systems they name ran: vLLM's V1 engine recomputes and never swaps;
SuperInfer runs LVF with its artifact's limits; a run's own limits win."""

from __future__ import annotations

import dataclasses

import pytest

from shunter.engine.config import SchedulerConfig
from shunter.engine.sim.baselines import BASELINES, get_baseline
from shunter.engine.sim.runner import simulate
from shunter.engine.sim.sweep import SweepSpec
from tests.engine.sim.test_runner import PRESSURE, assert_all_finished, pressure


def spec(**kw: object) -> SweepSpec:
    base = SweepSpec("qwen2.5-32b", "gh200", ("vllm", "superinfer", "fcfs"), (8.0,), 10, 5, 0.1)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_the_vllm_baseline_recomputes_and_never_swaps() -> None:
    vllm = BASELINES["vllm"]
    config = dataclasses.replace(
        pressure("fcfs"),
        scheduler=vllm.scheduler(xfer_budget_blocks=64),
        rotation=vllm.rotation(),
        check_integrity=True,
    )
    run = simulate(config, PRESSURE)
    assert_all_finished(run, PRESSURE)
    assert run.rotations > 0  # memory ran out: requests were preempted ...
    # ... and recomputed: no KV block ever went to host memory or came back.
    assert run.d2h_bytes == 0 and run.h2d_bytes == 0 and run.peak_host_bytes == 0
    # The swap-based FCFS on the same workload does copy.
    swapping = simulate(pressure("fcfs"), PRESSURE)
    assert swapping.d2h_bytes > 0 and swapping.h2d_bytes > 0


def test_baselines_carry_their_systems_settings() -> None:
    s = spec()
    vllm, superinfer, fcfs = (s.sim_config(p) for p in ("vllm", "superinfer", "fcfs"))
    assert (vllm.scheduler.policy, vllm.scheduler.preemption) == ("fcfs", "recompute")
    assert (vllm.scheduler.max_running, vllm.scheduler.max_batch_tokens) == (1024, 2048)
    assert vllm.scheduler.xfer_budget_blocks == 0 and not vllm.rotation.eager
    assert (superinfer.scheduler.policy, superinfer.scheduler.preemption) == ("lvf", "swap")
    assert superinfer.scheduler.max_running == superinfer.scheduler.max_batch_tokens == 16384
    assert superinfer.scheduler.xfer_budget_blocks == 2400 and superinfer.rotation.eager
    # A plain policy keeps the engine's defaults, with B_xfer from the link each step;
    # a baseline keeps its system's fixed one.
    defaults = SchedulerConfig()
    assert fcfs.scheduler == dataclasses.replace(defaults, policy="fcfs", xfer_budget_blocks=0)
    assert fcfs.xfer_budget_from_link
    assert not superinfer.xfer_budget_from_link and not vllm.xfer_budget_from_link


def test_limits_a_run_gives_replace_a_baselines_own() -> None:
    s = spec(max_running=64, max_batch_tokens=4096, xfer_budget=10)
    for name in ("vllm", "superinfer", "fcfs"):
        scheduler = s.sim_config(name).scheduler
        assert (scheduler.max_running, scheduler.max_batch_tokens) == (64, 4096)
        assert scheduler.xfer_budget_blocks == 10


def test_names_are_policies_or_baselines() -> None:
    assert get_baseline("lvf") is None
    with pytest.raises(ValueError, match="preemption"):
        SchedulerConfig(preemption="discard")
    with pytest.raises(ValueError, match="policy"):
        spec().sim_config("vllm-v0")
