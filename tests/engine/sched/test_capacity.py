"""KV capacity between models: floors lent while their model cannot use them, recalled
and given back when it can (``sched/capacity.py``)."""

from __future__ import annotations

import dataclasses

from shunter.engine.config import SloSpec, TenantSpec
from shunter.engine.core import EngineCore
from shunter.engine.request import Request, RequestState
from tests.engine.fakes import SLO, TINY, make_core, request, tiny_config

OTHER = dataclasses.replace(TINY, name="other")
BLOCK = TINY.block_bytes(4)  # one block per page in tiny_config
TIGHT = SloSpec("tight", ttft_s=0.001, tbt_s=0.1)  # lags from its first step on


def _core() -> EngineCore:
    """12 blocks of KV: 8 are tiny's floor, 4 what "other" may always hold."""
    config = tiny_config(
        kv_blocks=12,
        models=(TINY, OTHER),
        tenants=(TenantSpec("tiny", kv_floor=8 * BLOCK),),
        policy="fcfs",
    )
    return make_core(config)[0]


def test_an_idle_model_lends_none_of_its_floor() -> None:
    core = _core()
    others = [request(f"o{i}", 8, 8, model="other") for i in range(3)]  # 4 blocks each
    for r in others:
        core.add_request(r)
    while not core.is_idle():
        core.step()
        assert core.memory.held_bytes()["other"] <= 4 * BLOCK
    assert all(r.num_output_tokens == 8 for r in others)


def test_a_floor_its_running_requests_may_grow_into_is_not_lent() -> None:
    """With only a running request (no waiting head stranded), tiny lends nothing: its
    request may grow into any of the floor."""
    core = _core()
    core.add_request(request("running", 4, 20))  # 6 blocks at full length
    others = [request("o1", 8, 8, model="other"), request("o2", 4, 12, model="other")]
    for r in others:
        core.add_request(r)
    while not core.is_idle():
        core.step()
        assert core.memory.held_bytes()["other"] <= 4 * BLOCK
    assert [r.num_output_tokens for r in others] == [8, 12]


def test_a_floor_lent_keeps_what_its_running_requests_may_grow_into() -> None:
    """tiny's waiting request is stranded, so tiny lends its unheld floor, but not the
    blocks its running request will hold at full length: that request grows to the end
    without being preempted."""
    core = _core()
    memory = core.memory
    grows = request("grows", 4, 20)  # 6 blocks at full length
    core.add_request(grows)
    core.add_request(request("o1", 8, 8, model="other"))
    core.step()
    core.add_request(request("whole-floor", 30, 2))  # 8 blocks
    for i in (2, 3):
        core.add_request(request(f"o{i}", 4, 12, model="other"))  # 4 blocks each
    lent = False
    while not core.is_idle():
        core.step()
        lent = lent or memory.kept_floor_bytes("tiny") < memory.unheld_floor_bytes("tiny")
    assert lent
    assert grows.num_preemptions == 0
    assert grows.num_output_tokens == 20


def test_a_head_that_needs_more_than_its_own_memory_and_floor_keeps_the_floor() -> None:
    """Nothing of tiny runs and its 10-block request needs its whole 8-block floor and
    more: the floor is not stranded, so tiny lends none of it, and "other" holds no more
    than the 4 blocks beyond it while that request waits."""
    core = _core()
    first = request("o0", 12, 4, model="other")  # 3-4 blocks: tiny's request cannot fit
    core.add_request(first)
    core.step()
    big = request("big", 36, 2)  # 10 blocks
    core.add_request(big)
    for i in (1, 2):
        core.add_request(request(f"o{i}", 12, 4, model="other"))
    while big.state is RequestState.WAITING:
        core.step()
        assert core.memory.held_bytes()["other"] <= 4 * BLOCK
    while not core.is_idle():
        core.step()
    assert big.num_output_tokens == 2


def _lend_to_other(core: EngineCore, slo: SloSpec) -> tuple[Request, list[Request]]:
    """While tiny's running request holds part of its floor, its waiting 8-block request
    (of ``slo``) fits neither its free blocks nor the floor: tiny lends what the running
    one does not need, and "other" runs a second request in it. Returns the waiting
    request and other's two, once tiny's running request has finished."""
    memory = core.memory
    running = request("running", 4, 6)
    whole_floor = dataclasses.replace(request("whole-floor", 30, 2), slo=slo)  # 8 blocks
    borrowers = [request("o1", 8, 8, model="other"), request("o2", 4, 12, model="other")]
    core.add_request(running)
    core.add_request(borrowers[0])
    core.step()
    core.add_request(whole_floor)
    core.add_request(borrowers[1])
    lent = 0
    while running.state is not RequestState.FINISHED:
        core.step()
        lent = max(lent, memory.held_bytes()["other"])
        assert whole_floor.state is RequestState.WAITING
    assert lent > 4 * BLOCK  # beyond what "other" may always hold
    return whole_floor, borrowers


def test_a_floor_a_lagging_request_needs_is_given_back_by_preemption() -> None:
    """Once tiny's running request finishes, the waiting one fits the floor, and it lags
    (its TTFT tolerance is spent): the floor is recalled, "other" is preempted for what
    it took, and tiny's request runs two steps later."""
    core = _core()
    capacity = core.scheduler.capacity
    whole_floor, borrowers = _lend_to_other(core, TIGHT)
    assert capacity.num_repayments == 0
    for _ in range(3):
        core.step()
    assert whole_floor.state is not RequestState.WAITING
    assert capacity.num_repayments == 1
    assert any(r.state is RequestState.ROTARY for r in borrowers)
    assert core.memory.held_bytes()["other"] <= 4 * BLOCK
    while not core.is_idle():
        core.step()
    assert whole_floor.num_output_tokens == 2
    assert [r.num_output_tokens for r in borrowers] == [8, 12]


def test_a_request_within_its_tolerance_waits_for_the_borrowers_to_finish() -> None:
    """The same, but the waiting request meets its TTFT waiting: the floor is recalled
    (nobody borrows more of it) and comes back as "other" frees it, nobody preempted."""
    core = _core()
    whole_floor, borrowers = _lend_to_other(core, SLO)
    core.step()  # the first step to find tiny's request finished recalls the floor
    held = core.memory.held_bytes()["other"]
    while whole_floor.state is RequestState.WAITING:
        core.step()
        assert core.memory.held_bytes()["other"] <= held  # it borrows no more
        held = core.memory.held_bytes()["other"]
    assert core.scheduler.capacity.num_repayments == 0
    assert all(r.num_preemptions == 0 for r in borrowers)
    while not core.is_idle():
        core.step()
    assert whole_floor.num_output_tokens == 2


def test_a_lagging_request_aborted_before_its_floor_is_repaid_costs_nobody_a_preemption() -> None:
    """The floor is recalled for tiny's lagging request, which is then aborted before
    the next step: nothing is owed any more, so nobody is preempted."""
    core = _core()
    whole_floor, borrowers = _lend_to_other(core, TIGHT)
    core.step()  # recalls the floor: the lagging request would fit it
    core.abort(whole_floor.id)
    for _ in range(3):
        core.step()
    assert core.scheduler.capacity.num_repayments == 0
    assert all(r.num_preemptions == 0 for r in borrowers)


def test_a_floor_is_repaid_by_preempting_only_what_the_borrower_holds_beyond_its_own() -> None:
    """The "other" model (a 6-block floor) borrowed tiny's floor for a later request; when tiny's
    lagging request is owed the floor, the request preempted is one that fits in what
    "other" holds beyond its floor (4 blocks), not the latest arrival (6-7 blocks), whose
    preemption would take "other" below its own floor."""
    config = tiny_config(
        kv_blocks=16,
        models=(TINY, OTHER),
        tenants=(TenantSpec("tiny", kv_floor=8 * BLOCK), TenantSpec("other", kv_floor=6 * BLOCK)),
        policy="fcfs",
    )
    core, clock = make_core(config)
    early = request("early", 8, 14, model="other")
    for r in (request("running", 4, 6), early, request("filler", 16, 3, model="other")):
        core.add_request(r)
    core.step()
    whole_floor = dataclasses.replace(request("whole-floor", 30, 2), slo=TIGHT)  # 8 blocks
    core.add_request(whole_floor)
    core.step()
    late = request("late", 20, 12, t_arr=clock.now() + 1e-6, model="other")  # 5-8 blocks
    core.add_request(late)
    while whole_floor.state is RequestState.WAITING:
        core.step()
    assert core.scheduler.capacity.num_repayments == 1
    assert early.num_preemptions == 1
    assert late.num_preemptions == 0
    while not core.is_idle():
        core.step()
    assert [r.num_output_tokens for r in (whole_floor, early, late)] == [2, 14, 12]


def test_a_temporal_model_without_the_turn_holds_no_floor_where_the_policy_rotates() -> None:
    """tiny's request holds part of its 8-block floor and waits while "other" holds the
    turn. Under lvf+ the floor does not hold meanwhile: "other" takes more than the 4
    blocks beyond it. Under fcfs, which does not rotate, it holds. Every request
    finishes either way: tiny has its floor back once its turn comes."""
    for policy, beyond_floor in (("lvf+", True), ("fcfs", False)):
        temporal = (
            TenantSpec("tiny", sharing="temporal", kv_floor=8 * BLOCK),
            TenantSpec("other", sharing="temporal"),
        )
        config = tiny_config(kv_blocks=12, models=(TINY, OTHER), tenants=temporal, policy=policy)
        core = make_core(config)[0]
        paused = request("paused", 4, 40)
        core.add_request(paused)
        core.step()
        others = [request(f"o{i}", 8, 8, model="other") for i in range(3)]  # 4 blocks each
        for r in others:
            core.add_request(r)
        most = 0
        while not core.is_idle():
            core.step()
            if core.scheduler.tenancy.holder == "other":
                most = max(most, core.memory.held_bytes()["other"])
        assert (most > 4 * BLOCK) is beyond_floor, policy
        assert paused.num_output_tokens == 40
        assert all(r.num_output_tokens == 8 for r in others)


def test_with_no_turn_holder_a_temporal_models_floor_holds() -> None:
    """tiny is temporal and idle, so nobody holds the turn: its floor holds under lvf+ as
    a spatial model's does, and "other" never holds more than the 4 blocks beyond it."""
    tenants = (
        TenantSpec("tiny", sharing="temporal", kv_floor=8 * BLOCK),
        TenantSpec("other"),
    )
    config = tiny_config(kv_blocks=12, models=(TINY, OTHER), tenants=tenants, policy="lvf+")
    core = make_core(config)[0]
    others = [request(f"o{i}", 8, 8, model="other") for i in range(3)]  # 4 blocks each
    for r in others:
        core.add_request(r)
    while not core.is_idle():
        core.step()
        assert core.scheduler.tenancy.holder is None
        assert core.memory.held_bytes()["other"] <= 4 * BLOCK
    assert all(r.num_output_tokens == 8 for r in others)
