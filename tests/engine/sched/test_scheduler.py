"""The Scheduler's shared mechanics: passive preemption, recompute, caps, several models."""

from __future__ import annotations

from shunter.engine.config import ModelSpec, RotationConfig
from shunter.engine.request import RequestState
from tests.engine.fakes import TINY, make_core, request, tiny_config

NO_ROTATION = RotationConfig(eager=False)


def test_passive_preemption_swaps_out_the_latest_arrival() -> None:
    core, _ = make_core(tiny_config(kv_blocks=4, policy="fcfs", rotation=NO_ROTATION))
    old = request("old", 4, 8, t_arr=0.0)
    new = request("new", 4, 8, t_arr=0.001)
    core.add_request(old)
    core.add_request(new)
    preempted: list[str] = []
    while not preempted:
        preempted = core.executor.plans[-1].preempted if core.step().num_preempted else []  # type: ignore[attr-defined]
    assert preempted == ["new"]
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


def test_lvf_does_not_rotate_for_slots_the_running_cap_holds() -> None:
    # Two running requests fill the cap; the four waiting would not fit the free blocks
    # all at once, but each fits when a slot opens: no step preempts anyone.
    core, _ = make_core(tiny_config(kv_blocks=40, max_running=2, policy="lvf"))
    requests = [request(f"r{i}", 40, 8, t_arr=0.001 * i) for i in range(6)]
    for r in requests:
        core.add_request(r)
    while not core.is_idle():
        assert core.step().num_preempted == 0
    assert all(r.num_output_tokens == 8 and r.num_preemptions == 0 for r in requests)


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
