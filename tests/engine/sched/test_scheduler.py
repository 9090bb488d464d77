"""The Scheduler's shared mechanics: passive preemption, recompute, caps, several models."""

from __future__ import annotations

import dataclasses

import pytest

from shunter.engine.config import (
    CAPACITY_SOURCES,
    ModelSpec,
    RemapConfig,
    RotationConfig,
    TenantSpec,
)
from shunter.engine.core import EngineCore
from shunter.engine.remap.timing import LayerTiming
from shunter.engine.request import Request, RequestState
from shunter.engine.sched.lvf import LvfPolicy
from shunter.engine.sched.policy import Decision, PolicyInput
from tests.engine.fakes import (
    SLO,
    TINY,
    Contents,
    FakeExecutor,
    FakeTransfers,
    StepClock,
    make_core,
    request,
    tiny_config,
)
from tests.engine.sched.helpers import ONE_STEP_TTFT, run_capped

NO_ROTATION = RotationConfig(eager=False)


def _first_preempted(core: EngineCore, *requests: Request) -> list[str]:
    """Add ``requests`` and step until one does preempt: the ids it preempted."""
    for r in requests:
        core.add_request(r)
    while not core.step().num_preempted:
        pass
    return list(core.executor.plans[-1].preempted)  # type: ignore[attr-defined]


def test_passive_preemption_swaps_out_the_latest_arrival() -> None:
    core, _ = make_core(tiny_config(kv_blocks=4, policy="fcfs", rotation=NO_ROTATION))
    old = request("old", 4, 8, t_arr=0.0)
    new = request("new", 4, 8, t_arr=0.001)
    assert _first_preempted(core, old, new) == ["new"]
    assert new.state is RequestState.ROTARY and old.state is RequestState.RUNNING
    assert new.num_computed_tokens > 0  # its KV went to host, not lost


def test_without_host_space_a_preempted_request_recomputes() -> None:
    config = tiny_config(kv_blocks=4, host_blocks=0, policy="fcfs", rotation=NO_ROTATION)
    core, _ = make_core(config)
    old, new = request("old", 4, 8), request("new", 4, 8, t_arr=0.001)
    core.add_request(old)
    core.add_request(new)
    while not core.step().num_preempted:
        pass
    assert new.state is RequestState.WAITING and new.num_computed_tokens == 0
    assert new.num_output_tokens > 0  # its tokens stay; their KV is recomputed
    while not core.is_idle():
        core.step()
    assert new.num_output_tokens == 8 and old.num_output_tokens == 8


def test_max_running_caps_admission() -> None:
    core, _ = make_core(tiny_config(kv_blocks=40, max_running=2))
    for i in range(5):
        core.add_request(request(f"r{i}", 4, 3))
    stats = core.step()
    assert stats.num_running == 2 and stats.num_waiting == 3


def test_lvf_frees_no_slot_while_nobody_lags() -> None:
    # The running cap is full and memory has room; the waiting requests are within
    # their TTFT tolerance (VLT 0), so no slot is freed: the requests run in arrival
    # order, two at a time, as FCFS runs them, instead of time-slicing every step.
    requests, num_steps, num_preempted = run_capped(SLO)
    fcfs, fcfs_steps, _ = run_capped(SLO, "fcfs")
    assert num_preempted == 0
    assert num_steps == fcfs_steps
    assert [r.t_first_token for r in requests] == [r.t_first_token for r in fcfs]


def test_lvf_turns_the_slots_over_at_the_pace_of_the_lag_once_requests_lag() -> None:
    # A TTFT tolerance of one step: the waiting requests lag at once. A running request
    # yields its slot to one that lags less than it has run, so the third request takes
    # a slot from one that ran from the start and starts before FCFS would start it. A
    # request swapped in keeps its slot until it has run as long as the others lag: the
    # slots turn over a few times, not every step, and no request is rotated out twice.
    requests, _, num_preempted = run_capped(ONE_STEP_TTFT)
    fcfs, _, _ = run_capped(ONE_STEP_TTFT, "fcfs")
    assert num_preempted > 0
    assert max(r.num_preemptions for r in requests) <= 1
    assert requests[2].t_first_token is not None and fcfs[2].t_first_token is not None
    assert requests[2].t_first_token < fcfs[2].t_first_token


def test_lvf_rotates_when_memory_limits_the_slots_it_may_fill() -> None:
    # A slot is free, but the next request does not fit beside the running ones: LVF
    # rotates out a running request to make room for it (Algorithm 1 as before).
    core, _ = make_core(tiny_config(kv_blocks=24, max_running=3, policy="lvf"))
    first = [request(f"a{i}", 40, 30) for i in range(2)]
    late = request("late", 40, 4, t_arr=0.001)
    for r in (*first, late):
        core.add_request(r)
    while late.num_output_tokens == 0:
        core.step()
    assert sum(r.num_preemptions for r in first) >= 1
    assert late.t_first_token is not None


def _rotating_core(delay: int) -> tuple[EngineCore, list[Request]]:
    """LVF with memory for about two of four long requests; copies complete ``delay``
    steps after they are submitted."""
    core, _ = make_core(tiny_config(kv_blocks=12, policy="lvf", xfer_budget=4), delay=delay)
    requests = [request(f"r{i}", 8, 16) for i in range(4)]
    for r in requests:
        core.add_request(r)
    return core, requests


def test_swapped_in_requests_sit_out_until_their_own_copies_land() -> None:
    core, requests = _rotating_core(delay=3)
    landed: set[int] = set()
    poll = core.transfers.poll

    def spy_poll(now: float) -> list[int]:
        done = poll(now)
        landed.update(done)
        return done

    core.transfers.poll = spy_poll  # type: ignore[method-assign]
    swapped_at: dict[str, int] = {}
    sat_out = 0
    while not core.is_idle():
        core.step()
        plan = core.executor.plans[-1]  # type: ignore[attr-defined]
        for e in plan.batch:
            if e.request_id in swapped_at:
                assert swapped_at.pop(e.request_id) in landed, "computed before its copies"
        sat_out += len(swapped_at)
        swapped_at.update((rid, plan.step) for rid in plan.swapped_in)
    assert sat_out > 0  # some copies outlasted a step: those requests waited, alone
    assert all(r.num_output_tokens == 16 for r in requests)


def test_swap_copies_in_flight_count_against_the_transfer_budget() -> None:
    core, requests = _rotating_core(delay=3)
    seen: list[tuple[int, int]] = []

    class Spy(LvfPolicy):
        def schedule(self, state: PolicyInput) -> Decision:
            seen.append((state.xfer_budget, core.memory.num_swap_blocks_in_flight))
            return super().schedule(state)

    core.scheduler.policy = Spy()
    while not core.is_idle():
        core.step()
    # LVF decides in bytes (one unit across models): B_xfer = 4 blocks of "tiny".
    block = core.memory.block_bytes("tiny")
    assert all(budget == max(0, 4 - in_flight) * block for budget, in_flight in seen)
    assert any(in_flight > 0 for _, in_flight in seen)
    assert all(r.num_output_tokens == 16 for r in requests)


def test_models_share_one_arena_and_all_finish() -> None:
    other = ModelSpec(
        "other",
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        hidden_size=32,
        intermediate_size=64,
        vocab_size=128,
    )
    core, _ = make_core(tiny_config(kv_blocks=30, models=(TINY, other), policy="lvf"))
    requests = [request(f"{m}{i}", 5 + i, 6, model=m) for m in ("tiny", "other") for i in range(8)]
    for r in requests:
        core.add_request(r)
    models_in_batches = set()
    while not core.is_idle():
        core.step()
        models_in_batches |= {e.model for e in core.executor.plans[-1].batch}  # type: ignore[attr-defined]
    assert models_in_batches == {"tiny", "other"}
    assert all(r.num_output_tokens == 6 for r in requests)
    assert core.memory.blocks_used() == {"tiny": 0, "other": 0}


OTHER = dataclasses.replace(TINY, name="other")


def test_a_request_that_does_not_fit_blocks_only_its_own_model() -> None:
    # After "hold", "tiny"'s next request needs 8 blocks and 7 are free. FCFS keeps
    # head-of-line order within "tiny", but "other" runs meanwhile.
    core, _ = make_core(tiny_config(kv_blocks=8, models=(TINY, OTHER), policy="fcfs"))
    hold = request("hold", 4, 4, t_arr=0.0)
    big = request("big", 29, 1, t_arr=0.1)
    small = request("small", 4, 2, t_arr=0.2, model="other")
    late = request("late", 4, 2, t_arr=0.3)
    for r in (hold, big, small, late):
        core.add_request(r)
    core.step()
    assert hold.state is small.state is RequestState.RUNNING
    assert big.state is late.state is RequestState.WAITING


def test_a_model_short_of_blocks_gets_the_empty_chunks_of_the_others() -> None:
    core, _ = make_core(tiny_config(kv_blocks=8, models=(TINY, OTHER), policy="fcfs"))
    first = [request(f"a{i}", 12, 2, model="other") for i in range(2)]  # 6 of 8 blocks
    for r in first:
        core.add_request(r)
    while not core.is_idle():
        core.step()
    assert core.memory.num_free_blocks("tiny") < 8  # "other" keeps its empty chunks ...
    wide = request("wide", 28, 2)  # ... until "tiny" needs all 8 blocks
    core.add_request(wide)
    while not core.is_idle():
        core.step()
    assert wide.num_output_tokens == 2


def test_an_executing_model_gives_back_only_the_chunks_another_lacks_an_idle_one_all() -> None:
    for busy in (True, False):
        core, _ = make_core(tiny_config(kv_blocks=8, models=(TINY, OTHER), policy="fcfs"))
        first = [request(f"a{i}", 12, 2, model="other") for i in range(2)]  # all 8 blocks
        for r in first:
            core.add_request(r)
        while not core.is_idle():
            core.step()
        memory = core.memory
        assert memory.num_held_free_blocks("other") == 8 and memory.num_free_blocks("tiny") == 0
        if busy:
            core.add_request(request("long", 3, 20, model="other"))  # one block to start
        four = request("four", 14, 2)  # 4 blocks
        core.add_request(four)
        core.step()
        assert four.state is RequestState.WAITING
        # Busy, it gave back the 4 blocks "tiny" lacks and kept the rest; idle, all.
        assert memory.num_held_free_blocks("other") == (3 if busy else 0)
        while not core.is_idle():
            core.step()
        assert four.num_output_tokens == 2


def test_temporal_models_take_turns_and_a_blocked_holder_passes_the_turn() -> None:
    tenants = (TenantSpec("tiny", sharing="temporal"), TenantSpec("other", sharing="temporal"))
    roomy = tiny_config(kv_blocks=160, models=(TINY, OTHER), tenants=tenants, policy="fcfs")
    core, _ = make_core(roomy)
    for i in range(3):
        core.add_request(request(f"t{i}", 4, 100, t_arr=0.0))
        core.add_request(request(f"o{i}", 4, 100, t_arr=0.0, model="other"))
    batches = []
    while not core.is_idle():
        core.step()
        batches.append({e.model for e in core.executor.plans[-1].batch})  # type: ignore[attr-defined]
    assert all(len(models) <= 1 for models in batches)  # one model at a time
    assert {"tiny"} in batches and {"other"} in batches
    # The turn passes once the waiting model's TTFT slack falls below the holder's TBT
    # slack (100 tokens outlast that), and back once the paused one's falls below.
    assert core.scheduler.tenancy.num_switches >= 2

    # A holder whose only request cannot fit while the other model holds the memory.
    config = tiny_config(kv_blocks=12, models=(TINY, OTHER), tenants=tenants, policy="fcfs")
    core, _ = make_core(config)
    hog = [request(f"h{i}", 12, 8, model="other") for i in range(2)]  # 10 of 12 blocks
    for r in hog:
        core.add_request(r)
    core.step()
    stuck = request("stuck", 16, 2)  # 5 blocks: waits for "other"'s requests
    core.add_request(stuck)
    while not core.is_idle():
        core.step()
    assert stuck.num_output_tokens == 2 and all(r.num_output_tokens == 8 for r in hog)


def test_a_waiting_model_gets_the_turn_within_its_ttft_while_two_others_decode() -> None:
    # Two temporal models decode long answers and pass the turn between them; a third's
    # requests arrive meanwhile. Ranked by VLT the paused decoders (alpha x their pause)
    # kept outranking the waiting requests (their wait less beta_F x TTFT) until those
    # were 5.5 s old; by deadline the waiting ones are the most urgent within a turn.
    third = dataclasses.replace(TINY, name="third")
    tenants = tuple(TenantSpec(m, sharing="temporal") for m in ("tiny", "other", "third"))
    config = tiny_config(
        kv_blocks=480, models=(TINY, OTHER, third), tenants=tenants, turn_quantum_s=1.0
    )
    core, clock = make_core(config)
    core.add_request(request("t", 4, 600))
    core.add_request(request("o", 4, 600, model="other"))
    waiting = [request(f"w{i}", 4, 4, t_arr=0.5, model="third") for i in range(2)]
    while clock.t < 0.5:
        core.step()
    for r in waiting:
        core.add_request(r)
    while not core.is_idle():
        core.step()
    for r in waiting:
        assert r.ttft is not None and r.ttft < SLO.ttft_s
    assert core.scheduler.tenancy.num_switches >= 3


def test_a_model_whose_requests_are_all_late_gets_the_turn_within_its_ttft() -> None:
    # "tiny" decodes a long answer with TBT slack to spare, so it always has a request in
    # time; "other" has one request, late from the start. In-time work goes first, but
    # not for longer than the late model's TTFT target: then it gets a turn.
    tenants = tuple(TenantSpec(m, sharing="temporal", slo=SLO) for m in ("tiny", "other"))
    config = tiny_config(kv_blocks=480, models=(TINY, OTHER), tenants=tenants, turn_quantum_s=0.5)
    core, _ = make_core(config)
    long = request("long", 4, 1000)
    late = request("late", 4, 4, t_arr=-2 * SLO.ttft_s, model="other")
    core.add_request(long)
    core.add_request(late)
    while late.t_first_token is None:
        core.step()
    assert SLO.ttft_s <= late.t_first_token <= SLO.ttft_s + 0.5
    assert long.num_output_tokens < 1000  # it had not finished: the turn was taken from it
    while not core.is_idle():
        core.step()
    assert long.num_output_tokens == 1000 and core.scheduler.tenancy.num_switches == 2


def _two_models(sharing: str, **kwargs: object) -> tuple[EngineCore, list[Request]]:
    """ "tiny" and "other", both ``sharing``, three long requests each, all admitted."""
    tenants = (TenantSpec("tiny", sharing=sharing), TenantSpec("other", sharing=sharing))
    config = tiny_config(
        kv_blocks=40, models=(TINY, OTHER), tenants=tenants, turn_quantum_s=10.0, **kwargs
    )
    core, _ = make_core(config)
    requests = [request(f"{m}{i}", 4, 40, model=m) for m in ("tiny", "other") for i in range(3)]
    for r in requests:
        core.add_request(r)
    return core, requests


def _batched(core: EngineCore) -> set[str]:
    return {e.model for e in core.executor.plans[-1].batch}  # type: ignore[attr-defined]


def test_set_tenants_turns_spatial_models_temporal_at_the_next_step_keeping_requests() -> None:
    core, requests = _two_models("spatial")
    for _ in range(3):
        core.step()
    assert _batched(core) == {"tiny", "other"}
    states = {r.id: (r.state, r.num_computed_tokens) for r in requests}
    core.scheduler.set_tenants(
        [TenantSpec("tiny", sharing="temporal"), TenantSpec("other", sharing="temporal")]
    )
    # Nothing moved: every request is where it was, with its KV.
    assert {r.id: (r.state, r.num_computed_tokens) for r in requests} == states
    assert set(core.scheduler.requests) == {r.id for r in requests}
    core.step()
    assert len(_batched(core)) == 1  # one model at a time from the next step on
    holder = core.scheduler.tenancy.holder
    assert _batched(core) == {holder}
    # And back: both run again at the next step, the turn history kept.
    core.scheduler.set_tenants([TenantSpec("tiny"), TenantSpec("other")])  # defaults: spatial
    assert core.scheduler.tenancy.holder is None
    core.step()
    assert _batched(core) == {"tiny", "other"}
    while not core.is_idle():
        core.step()
    assert all(r.num_output_tokens == 40 for r in requests)


def test_set_tenants_keeps_a_temporal_holder_its_turn_and_the_switch_count() -> None:
    core, _ = _two_models("temporal")
    for _ in range(3):
        core.step()
    tenancy = core.scheduler.tenancy
    holder, switches = tenancy.holder, tenancy.num_switches
    last_active = dict(tenancy.t_last_active)
    assert holder is not None
    core.scheduler.set_tenants(
        [
            TenantSpec("tiny", sharing="temporal", priority=2),
            TenantSpec("other", sharing="temporal", priority=1),
        ]
    )
    assert tenancy.holder == holder and tenancy.num_switches == switches
    assert tenancy.t_last_active == last_active
    assert tenancy.tenants["tiny"].priority == 2
    core.step()
    assert _batched(core) == {holder}  # within its quantum it keeps running


def test_set_tenants_bounds_claims_from_now_on_and_refuses_bounds_a_request_cannot_fit() -> None:
    core, requests = _two_models("spatial")
    core.step()
    memory = core.memory
    block = memory.block_bytes("other")
    held = memory.held_bytes()["other"] // block
    held_free = memory.num_held_free_blocks("other")
    assert 0 < held < 12 and memory.num_free_blocks("other") > 12 - held + held_free
    # A ceiling of 12 blocks (each request needs 11): "other" keeps what it holds and
    # may claim up to the ceiling.
    core.scheduler.set_tenants([TenantSpec("other", kv_ceiling=12 * block)])
    assert memory.held_bytes()["other"] == held * block
    assert memory.num_free_blocks("other") == 12 - held + held_free
    assert memory.num_total_blocks("other") == 12
    for _ in range(30):  # three requests of 11 blocks: more than the ceiling holds
        core.step()
        assert memory.held_bytes()["other"] <= 12 * block
    assert memory.held_bytes()["other"] == 12 * block
    # A floor for "tiny" is memory "other" may never hold (and the ceiling is gone).
    core.scheduler.set_tenants([TenantSpec("tiny", kv_floor=20 * block)])
    assert memory.num_total_blocks("other") == 20 and memory.num_total_blocks("tiny") == 40
    # A 10-block ceiling, or a 30-block floor for the other model, would strand a
    # request for good: refused, and nothing changes.
    for bad in (
        [TenantSpec("tiny", sharing="temporal"), TenantSpec("other", kv_ceiling=10 * block)],
        [TenantSpec("tiny", sharing="temporal", kv_floor=30 * block)],
    ):
        with pytest.raises(ValueError, match="needs 11 KV blocks"):
            core.scheduler.set_tenants(bad)
    assert memory.bounds.floors == {"tiny": 20 * block} and not memory.bounds.ceilings
    assert core.scheduler.tenancy.temporal == []
    with pytest.raises(ValueError, match="distinct served models"):
        core.scheduler.set_tenants([TenantSpec("tiny"), TenantSpec("tiny")])
    with pytest.raises(ValueError, match="distinct served models"):
        core.scheduler.set_tenants([TenantSpec("nope")])
    core.scheduler.set_tenants([])  # every model back to the defaults
    assert memory.bounds.unbounded
    while not core.is_idle():
        core.step()
    assert all(r.num_output_tokens == 40 for r in requests)


def _c2_like(capacity_order: tuple[str, ...]) -> EngineCore:
    """Two temporal tenants of unequal size (c2's shape) with remapping and LVF, their
    requests arriving in alternating bursts, memory short throughout."""
    models = (
        dataclasses.replace(TINY, name="big", num_layers=8, num_kv_heads=4),
        dataclasses.replace(TINY, name="small", num_layers=4),
    )
    config = tiny_config(
        kv_blocks=12,
        models=models,
        tenants=tuple(TenantSpec(m.name, sharing="temporal") for m in models),
        remap=RemapConfig(enabled=True, cap_fraction=0.5, capacity_order=capacity_order),
        policy="lvf",
        turn_quantum_s=0.02,
    )
    clock = StepClock()
    transfers = FakeTransfers(1)
    executor = FakeExecutor(clock, transfers)
    timing = LayerTiming(t_transfer=1e-5, t_decode=0.01, t_prefill=0.05)
    core = EngineCore(
        config, executor, transfers, clock, timings=dict.fromkeys(("big", "small"), timing)
    )
    executor.contents = transfers.contents = Contents(config.block_tokens)
    executor.memory = core.memory
    arrivals = sorted(
        (burst * 20 + i, request(f"{m}{burst}-{i}", 6 + i % 5, 10, model=m))
        for burst, m in enumerate(["big", "small", "big", "small"])
        for i in range(8)
    )
    requests = [r for _, r in arrivals]
    step = 0
    while arrivals or not core.is_idle():
        assert step < 5000, "no progress"
        while arrivals and arrivals[0][0] <= step:
            r = arrivals.pop(0)[1]
            r.t_arr = clock.now()
            core.add_request(r)
        core.step()
        step += 1
    assert all(r.num_output_tokens == r.max_output_tokens for r in requests)
    return core


def _chosen_preemptions(core: EngineCore) -> int:
    plans = core.executor.plans  # type: ignore[attr-defined]
    total = sum(len(p.preempted) for p in plans)
    return total - core.scheduler.num_passive_preemptions


def test_a_capacity_order_without_rotation_never_rotates_by_choice() -> None:
    by_default = _chosen_preemptions(_c2_like(CAPACITY_SOURCES))
    assert by_default > 0
    assert _chosen_preemptions(_c2_like(("free", "inactive", "active"))) == 0
    # Rotation after the active models' layers: those are lent first, rotation less.
    assert _chosen_preemptions(_c2_like(("free", "inactive", "active", "rotation"))) < by_default


def test_the_plan_carries_each_entrys_tokens_and_block_table() -> None:
    # The executor reads nothing but the plan: every batch entry's tokens, and its
    # request's block table as it stands after the step's moves.
    core, _ = make_core(tiny_config(kv_blocks=64, max_batch_tokens=16))
    prompts = {f"r{i}": list(range(100 * i, 100 * i + 20 + i)) for i in range(3)}
    requests = []
    for rid, ids in prompts.items():
        r = dataclasses.replace(request(rid, len(ids), 5), prompt_token_ids=ids)
        requests.append(r)
        core.add_request(r)
    seen = 0
    while not core.is_idle():
        core.step()
        plan = core.executor.plans[-1]  # type: ignore[attr-defined]
        assert (
            plan.token_ids.keys() == plan.block_tables.keys() == {e.request_id for e in plan.batch}
        )
        for e in plan.batch:
            r = next(q for q in requests if q.id == e.request_id)
            whole = prompts[r.id] + r.output_token_ids
            start = e.num_computed_tokens
            assert plan.token_ids[r.id] == whole[start : start + e.num_tokens]
            blocks = plan.block_tables[r.id]
            assert len(blocks) * core.memory.block_tokens >= start + e.num_tokens
            seen += 1
    assert seen >= 3 * 5


def test_without_chunked_prefill_a_models_step_runs_whole_prompts_or_decodes() -> None:
    # vLLM V0's default scheduling: "tiny" decodes until a 47-token prompt arrives; that
    # step runs the whole prompt and no decode of "tiny" (chunked, the 46 tokens the two
    # decodes leave of 48 would split it), while "other" decodes on.
    tenants = (TenantSpec("tiny"), TenantSpec("other"))
    config = tiny_config(
        kv_blocks=200, models=(TINY, OTHER), tenants=tenants, policy="fcfs", max_batch_tokens=48
    )
    scheduler = dataclasses.replace(config.scheduler, chunked_prefill=False)
    core, _ = make_core(dataclasses.replace(config, scheduler=scheduler))
    core.add_request(request("a", 4, 20))
    core.add_request(request("o", 4, 20, model="other"))
    core.step()
    core.step()
    late = request("late", 47, 1)
    core.add_request(late)
    core.step()
    plan = core.executor.plans[-1]  # type: ignore[attr-defined]
    tiny = [(e.request_id, e.num_tokens, e.is_prefill) for e in plan.batch if e.model == "tiny"]
    assert tiny == [("late", 47, True)]
    assert [(e.request_id, e.num_tokens) for e in plan.batch if e.model == "other"] == [("o", 1)]
    core.step()
    plan = core.executor.plans[-1]  # type: ignore[attr-defined]
    assert [e.request_id for e in plan.batch if e.model == "tiny"] == ["a"]
    while not core.is_idle():
        core.step()
    assert late.num_output_tokens == 1
    # A recompute prefills the whole context in one step: a request that may outgrow
    # the step's tokens is refused.
    with pytest.raises(ValueError, match="without chunked prefill"):
        core.add_request(request("long", 40, 10))
    with pytest.raises(ValueError, match="needs chunked_prefill"):
        dataclasses.replace(scheduler, step_target_s=0.05)


def test_lvf_plus_passive_preemption_swaps_out_a_request_behind_its_slo() -> None:
    # The same two requests as the first test, "old" with a TBT target no step meets:
    # under lvf+ the decode out of blocks takes them from "old", already behind, and
    # "new", still in time, runs on.
    config = tiny_config(kv_blocks=4, policy="lvf+", rotation=NO_ROTATION)
    core, _ = make_core(config)
    tight = dataclasses.replace(SLO, tbt_s=1e-6)
    old = dataclasses.replace(request("old", 4, 8, t_arr=0.0), slo=tight)
    new = request("new", 4, 8, t_arr=0.001)
    assert _first_preempted(core, old, new) == ["old"]
    assert old.state is RequestState.ROTARY and new.state is RequestState.RUNNING
    while not core.is_idle():
        core.step()
    assert old.num_output_tokens == 8 and new.num_output_tokens == 8


def test_passive_victims_are_judged_at_the_last_steps_duration() -> None:
    """lvf+ judges a TBT target out of reach at one token a step: the preemptor that
    asks it for a victim knows the last step's duration once a step has run."""
    config = tiny_config(kv_blocks=4, policy="lvf+", rotation=NO_ROTATION)
    core, _ = make_core(config)
    assert core.scheduler.preemptor.step_s() is None
    core.add_request(request("a", 4, 8))
    stats = core.step()
    step_s = core.scheduler.preemptor.step_s()
    assert step_s is not None and step_s > 0.0
    assert step_s == pytest.approx(stats.duration_s)


def test_a_temporal_model_below_its_floor_gets_memory_back_while_it_waits_for_its_turn() -> None:
    """The holder gives back what a waiting model below its KV floor lacks in the steps
    it runs, not only in the steps the waiting model holds the turn: the memory is there
    when its turn comes."""
    block = TINY.block_bytes(4)  # one block per page in tiny_config
    temporal = (TenantSpec("tiny", sharing="temporal"), TenantSpec("other", sharing="temporal"))
    config = tiny_config(kv_blocks=8, models=(TINY, OTHER), tenants=temporal, policy="fcfs")
    core, _ = make_core(config)
    for r in [request(f"a{i}", 12, 2, model="other") for i in range(2)]:  # all 8 blocks
        core.add_request(r)
    while not core.is_idle():
        core.step()
    memory, tenancy = core.memory, core.scheduler.tenancy
    assert memory.num_held_free_blocks("other") == 8 and memory.num_free_blocks("tiny") == 0
    core.add_request(request("long", 3, 10, model="other"))  # the holder, one block
    core.step()
    assert tenancy.holder == "other"
    floors = (dataclasses.replace(temporal[0], kv_floor=4 * block), temporal[1])
    core.scheduler.set_tenants(floors)
    four = request("four", 14, 2)  # 4 blocks of tiny's floor, all held by "other"
    core.add_request(four)
    core.step()
    assert tenancy.holder == "other" and four.state is RequestState.WAITING
    assert memory.num_free_blocks("tiny") >= 4  # given back while "other" held the turn
    while not core.is_idle():
        core.step()
    assert four.num_output_tokens == 2
