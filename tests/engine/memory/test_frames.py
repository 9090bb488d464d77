"""Weight frames lent to the KV cache and taken back: pages, moves and fences."""

from __future__ import annotations

import dataclasses

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
