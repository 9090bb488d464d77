"""Weight frames lent to the KV cache and taken back: pages, moves and fences."""

from __future__ import annotations

import dataclasses

import pytest

from shunter.engine.config import RotationConfig
from shunter.engine.memory.arena import FREE, PageOwner
from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.plan import StepPlan
from shunter.engine.request import Request, RequestState
from tests.engine.fakes import TINY, request, tiny_config

TALL = dataclasses.replace(TINY, name="tall", num_layers=8)


def memory_with_no_free_kv() -> KVMemory:
    memory = KVMemory(tiny_config(kv_blocks=0, models=(TALL,)))
    assert memory.num_free_blocks("tall") == 0
    return memory


def test_a_released_frame_becomes_kv_capacity() -> None:
    memory = memory_with_no_free_kv()
    pages = memory.frame_pages("tall", 3)
    assert memory.frame_bytes("tall") == len(pages) * memory.arena.page_bytes
    memory.release_frame("tall", 3)
    assert all(memory.arena.owner(p) is FREE for p in pages)
    block_pages = TALL.block_bytes(4) // memory.arena.page_bytes
    assert memory.num_free_blocks("tall") == len(pages) // block_pages


def test_memory_names_the_layers_whose_frames_are_lent() -> None:
    memory = memory_with_no_free_kv()
    assert memory.remapped_layers("tall") == []
    memory.release_frame("tall", 5)
    memory.release_frame("tall", 3)
    assert memory.remapped_layers("tall") == [3, 5]


def test_taking_a_frame_back_moves_its_kv_out_first() -> None:
    memory = memory_with_no_free_kv()
    for frame in (3, 4):
        memory.release_frame("tall", frame)
    memory.begin_step(StepPlan(step=0))
    r = request("r", 4 * 3, 4, model="tall")
    memory.allocate(r)  # the lowest free pages: frame 4's (placed below frame 3)
    r.state = RequestState.RUNNING
    r.num_computed_tokens = 12
    memory.mark_computed(r)
    in_frame_4 = list(memory.block_ids("r"))
    memory.end_step()
    costs = memory.frame_costs("tall", [3, 4])
    frame = 4 if costs[4] else 3
    assert costs[frame] == len(in_frame_4)

    plan = StepPlan(step=1)
    memory.begin_step(plan)
    assert not memory.vacate_frame("tall", frame)  # blocks moved, sources still fenced
    assert len(plan.moves["tall"]) == len(in_frame_4)
    assert not set(memory.block_ids("r")) & set(in_frame_4)
    memory.end_step()
    memory.complete([1])
    memory.begin_step(StepPlan(step=2))
    assert memory.vacate_frame("tall", frame)
    owner = PageOwner.weights("tall", frame)
    assert all(memory.arena.owner(p) == owner for p in memory.frame_pages("tall", frame))
    memory.end_step()
    memory.check_integrity([r])


def test_a_cancelled_take_back_gives_the_pages_to_the_kv_cache_again() -> None:
    memory = memory_with_no_free_kv()
    memory.release_frame("tall", 5)
    free = memory.arena.num_free_pages
    memory.begin_step(StepPlan(step=0))
    assert memory.vacate_frame("tall", 5)  # nothing lived there: at once
    assert memory.arena.num_free_pages == free - len(memory.frame_pages("tall", 5))
    memory.cancel_vacate("tall", 5)
    memory.end_step()
    assert memory.arena.num_free_pages == free
    memory.check_integrity([])


def test_taking_a_frame_back_never_moves_kv_into_that_frame() -> None:
    # A chunk over the frame that empties is given back to the arena while the frame is
    # taken back; the live blocks of the frame's other chunks must then move elsewhere,
    # not into that chunk, or they would move back and forth every step and the frame
    # would never come back.
    memory = memory_with_no_free_kv()
    for frame in (3, 4):
        memory.release_frame("tall", frame)
    memory.begin_step(StepPlan(step=0))
    gone, live = request("gone", 4 * 3, 4, model="tall"), request("live", 4 * 3, 4, model="tall")
    for r in (gone, live):
        memory.allocate(r)  # the lowest free pages: frame 4's
        r.state = RequestState.RUNNING
        r.num_computed_tokens = 12
        memory.mark_computed(r)
    memory.free(gone)  # its chunk stays with the pool, empty
    memory.end_step()
    frame_4 = set(memory.frame_pages("tall", 4))
    pool = memory._pools["tall"]

    def pages_of(r: Request) -> set[int]:
        ids = memory.block_ids(r.id)
        return {p for b in ids for p in pool.chunk_pages(b // pool.blocks_per_chunk)}

    assert pages_of(live) <= frame_4
    plan = StepPlan(step=1)
    memory.begin_step(plan)
    assert not memory.vacate_frame("tall", 4)
    assert plan.moves["tall"]
    assert not pages_of(live) & frame_4
    memory.end_step()
    memory.complete([1])
    memory.begin_step(StepPlan(step=2))
    assert memory.vacate_frame("tall", 4)
    memory.end_step()
    memory.check_integrity([live])


def run_like_the_engine(plan: StepPlan, device: dict[int, str], host: dict[int, str]) -> None:
    """Apply a plan's KV copies and moves to block contents in the order the engine
    runs them: the transfers' D2H then H2D batches at ``submit``, then the executor's
    moves (every source read before any destination is written). A block never
    written holds garbage."""
    for model in {*plan.swap_out, *plan.rotate}:
        d2h = plan.d2h(model)
        host.update(
            (h, device.get(d, "garbage")) for d, h in zip(d2h.devices, d2h.hosts, strict=True)
        )
    for copies in plan.swap_in.values():
        device.update(
            (d, host.get(h, "garbage")) for d, h in zip(copies.devices, copies.hosts, strict=True)
        )
    for moves in plan.moves.values():
        device.update([(m.dst, device.get(m.src, "garbage")) for m in moves])


@pytest.mark.parametrize("copy", ["preemption", "eager rotation"])
def test_kv_copied_to_host_in_the_step_it_moves_out_of_a_frame_comes_back_intact(
    copy: str,
) -> None:
    # A frame taken back moves its blocks out, and the same step copies them to host.
    # The moves run after the copies, so the copies must read the moves' sources: the
    # destinations do not hold the KV yet.
    rotation = RotationConfig(eager=copy == "eager rotation", budget_blocks=100, watermark=0.0)
    memory = KVMemory(tiny_config(kv_blocks=0, models=(TALL,), rotation=rotation))
    for frame in (3, 4):
        memory.release_frame("tall", frame)
    r = request("r", 4 * 3, 4, model="tall")
    plans = [StepPlan(step=s) for s in range(4)]
    memory.begin_step(plans[0])
    memory.allocate(r)
    r.state = RequestState.RUNNING
    r.num_computed_tokens = 12
    memory.mark_computed(r)
    device = {b: f"kv{i}" for i, b in enumerate(memory.block_ids("r"))}
    host: dict[int, str] = {}
    costs = memory.frame_costs("tall", [3, 4])

    def step(plan: StepPlan) -> None:
        memory.end_step()
        run_like_the_engine(plan, device, host)
        memory.complete([plan.step])
        memory.check_integrity([r])

    step(plans[0])
    memory.begin_step(plans[1])
    assert not memory.vacate_frame("tall", 4 if costs[4] else 3)
    assert len(plans[1].moves["tall"]) == 3
    if copy == "preemption":
        memory.swap_out(r)
        r.state = RequestState.ROTARY
    else:
        assert memory.rotate() == 3
    step(plans[1])
    memory.begin_step(plans[2])
    if r.state is RequestState.RUNNING:
        assert memory.swap_out(r)  # the rotated copies are valid: nothing more to copy
        r.state = RequestState.ROTARY
    assert not plans[2].has_transfers
    step(plans[2])
    memory.begin_step(plans[3])
    memory.swap_in(r)
    r.state = RequestState.RUNNING
    step(plans[3])
    assert [device[b] for b in memory.block_ids("r")] == ["kv0", "kv1", "kv2"]
