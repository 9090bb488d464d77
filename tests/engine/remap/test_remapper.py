"""The Remapper on real memory: the order in which it carries out the controller's
decisions."""

from __future__ import annotations

import dataclasses

from shunter.engine.config import RemapConfig
from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.plan import StepPlan, StepResult
from shunter.engine.remap.controller import Pressure
from shunter.engine.remap.remapper import Remapper
from shunter.engine.remap.timing import LayerTiming
from tests.engine.fakes import TINY, tiny_config

MODELS = tuple(dataclasses.replace(TINY, name=n, num_layers=8) for n in ("a", "b", "c"))
TIMING = LayerTiming(t_transfer=1e-5, t_decode=0.01, t_prefill=0.05)


def step(remapper: Remapper, memory: KVMemory, pressure: Pressure, run_next: list[str]) -> StepPlan:
    plan = StepPlan(step=0)
    memory.begin_step(plan)
    remapper.plan(
        plan,
        pressure,
        active=(),
        t_last_active=dict.fromkeys(remapper.maps, 0.0),
        run_next=run_next,
    )
    memory.end_step()
    return plan


def test_reversion_restores_the_model_most_likely_to_run_next_first() -> None:
    config = tiny_config(
        kv_blocks=4,
        models=MODELS,
        remap=RemapConfig(enabled=True, cap_fraction=0.5, headroom_fraction=0.0),
    )
    memory = KVMemory(config)
    remapper = Remapper(config, memory, dict.fromkeys(("a", "b", "c"), TIMING))
    lent = step(remapper, memory, Pressure(demand=10**12, free=0), ["a", "b", "c"])
    assert list(lent.remapped) and all(remapper.alpha().values())

    for run_next in (["a", "c", "b"], ["c", "b", "a"], ["b", "a", "c"]):
        plan = step(remapper, memory, Pressure(demand=0, free=10**12), run_next)
        assert list(plan.restored) == run_next
        assert remapper.alpha() == {"a": 0, "b": 0, "c": 0}
        step(remapper, memory, Pressure(demand=10**12, free=0), run_next)
    memory.check_integrity([])


def test_layer_copies_slower_than_the_prior_lend_fewer_layers() -> None:
    """T_T follows the copies the executor reports: a model whose copies share a busy
    link (here 20 ms where it was profiled at 10 us) hides fewer streamed layers behind
    its passes, so it lends fewer; the others lend as before."""
    config = tiny_config(
        kv_blocks=4,
        models=MODELS,
        remap=RemapConfig(enabled=True, cap_fraction=0.5, headroom_fraction=0.0),
    )
    pressure = Pressure(demand=10**12, free=0)
    before = Remapper(config, KVMemory(config), dict.fromkeys(("a", "b", "c"), TIMING))
    step(before, before.memory, pressure, ["a", "b", "c"])
    assert before.alpha() == {"a": 4, "b": 4, "c": 4}

    memory = KVMemory(config)
    slow = Remapper(config, memory, dict.fromkeys(("a", "b", "c"), TIMING))
    for _ in range(30):
        slow.observe(StepPlan(step=0), StepResult(duration_s=0.05, copy_s={"a": 0.02}))
    assert slow.times["a"].t_transfer > 0.019 and slow.times["b"] == TIMING
    step(slow, memory, pressure, ["a", "b", "c"])
    assert slow.alpha() == {"a": 0, "b": 4, "c": 4}
