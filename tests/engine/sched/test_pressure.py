"""KvBytes: the KV demand the remapping controller weighs counts what LVF may admit."""

from __future__ import annotations

import dataclasses

from shunter.engine.config import SloSpec
from tests.engine.fakes import SLO, make_core, request, tiny_config


def _extra_demand(waited_s: float, slo: SloSpec = SLO) -> tuple[int, int]:
    """With the running cap full (two requests running for 0.1 s, memory ample), the
    demand LVF's pressure adds over FCFS's for a request of class ``slo`` that arrived
    ``waited_s`` ago, and that request's bytes."""
    core, clock = make_core(tiny_config(kv_blocks=40, max_running=2, policy="lvf"))
    for i in range(2):
        core.add_request(request(f"r{i}", 8, 30))
    for _ in range(10):  # 0.01 s a step
        core.step()
    kv, now = core.scheduler.kv, clock.now()
    waiting = dataclasses.replace(request("w", 8, 4, t_arr=now - waited_s), slo=slo)
    core.add_request(waiting)

    def demand(rotates: bool) -> int:
        return kv.pressure(["tiny"], set(), now=now, num_running=2, rotates=rotates).demand

    return demand(True) - demand(False), kv.of([waiting])[0]


TIGHT = SloSpec("tight", ttft_s=0.02, tbt_s=0.1)  # a tolerance of 0.01 s


def test_pressure_counts_a_slot_lvf_frees_for_a_request_that_lags_less_than_they_ran() -> None:
    # Its VLT (0.06 s less the tolerance) is below the 0.1 s the running ones have run,
    # so LVF takes a slot for it.
    extra, size = _extra_demand(0.06, TIGHT)
    assert size > 0 and extra == size


def test_pressure_counts_no_slot_for_a_request_that_lagged_longer_than_they_ran() -> None:
    # It arrived 8 s ago: it lags more than every running request has run, so it waits
    # for a slot a finishing request frees.
    extra, _ = _extra_demand(8.0, TIGHT)
    assert extra == 0


def test_pressure_counts_no_slot_for_a_request_within_its_tolerance() -> None:
    extra, _ = _extra_demand(0.06)
    assert extra == 0
