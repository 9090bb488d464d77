"""KvBytes: the KV demand the remapping controller weighs counts what LVF may admit."""

from __future__ import annotations

import dataclasses

from shunter.engine.config import SloSpec, TenantSpec
from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.sched.pressure import KvBytes
from shunter.engine.sched.queues import RequestQueues
from tests.engine.fakes import SLO, TINY, make_core, request, tiny_config

OTHER = dataclasses.replace(TINY, name="other")


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


def test_the_room_keeps_each_floor_apart_and_offers_what_a_pool_holds_beyond_it() -> None:
    """tiny's floor is 4 blocks of the 10: before it holds any, those pages are kept for
    it and 6 are shared; holding 6 free blocks, 2 of them are beyond its floor (spare, and
    tiny is movable) and nothing is kept."""
    block = TINY.block_bytes(4)  # one block per page in tiny_config
    config = tiny_config(
        kv_blocks=10,
        models=(TINY, OTHER),
        tenants=(TenantSpec("tiny", kv_floor=4 * block), TenantSpec("other")),
    )
    memory = KVMemory(config)
    queues = {m: RequestQueues() for m in ("tiny", "other")}
    kv = KvBytes(memory, queues, config.scheduler)
    room = kv.room(["tiny", "other"])
    assert (room.kept, room.shared_pages) == ({"tiny": 4 * block, "other": 0}, 6 * block)
    assert room.spare == {"tiny": 0, "other": 0} and not room.movable
    r = request("r", 24, 4)  # 6 blocks of tiny
    memory.allocate(r)
    memory.free(r)
    room = kv.room(["tiny", "other"])
    assert room.held == {"tiny": 6 * block, "other": 0}
    assert room.spare == {"tiny": 2 * block, "other": 0} and room.movable == {"tiny"}
    assert room.kept == {"tiny": 0, "other": 0} and room.shared_pages == 4 * block
    assert room.ledger().available("other") == 2 * block + 4 * block  # spare, shared pages
    assert room.total == kv.free(["tiny", "other"])  # as one sum
