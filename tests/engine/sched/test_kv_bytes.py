"""KvBytes: the KV demand the remapping controller weighs counts what LVF may admit."""

from __future__ import annotations

import dataclasses

from shunter.engine.config import SloSpec
from shunter.engine.request import Request
from tests.engine.fakes import make_core, request, tiny_config


def _extra_demand(waiting: Request) -> tuple[int, int]:
    """With the running cap full (two running requests since t = 0, memory ample), the
    demand LVF's pressure adds for ``waiting`` over FCFS's, and ``waiting``'s bytes."""
    core, clock = make_core(tiny_config(kv_blocks=40, max_running=2, policy="lvf"))
    for i in range(2):
        core.add_request(request(f"r{i}", 8, 30))
    core.step()
    core.add_request(waiting)
    kv, now = core.scheduler.kv, clock.now()

    def demand(rotates: bool) -> int:
        return kv.pressure(["tiny"], set(), now=now, num_running=2, rotates=rotates).demand

    return demand(True) - demand(False), kv.of([waiting])[0]


def test_pressure_counts_a_slot_lvf_frees_for_a_request_that_lagged_longer() -> None:
    # It arrived 8 s before the running ones started: its VLT (8 s less the 0.01 s
    # tolerance) is above their run time, so LVF takes a slot for it.
    tight = SloSpec("tight", ttft_s=0.02, tbt_s=0.1)
    lagging = dataclasses.replace(request("w", 8, 4, t_arr=-8.0), slo=tight)
    extra, size = _extra_demand(lagging)
    assert size > 0 and extra == size


def test_pressure_counts_no_slot_for_a_request_within_its_tolerance() -> None:
    extra, _ = _extra_demand(request("w", 8, 4))
    assert extra == 0
