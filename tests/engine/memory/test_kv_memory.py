"""KVMemory's paired verbs, DuplexKV's copy rules, compaction and the integrity check."""

from __future__ import annotations

import dataclasses

import pytest

from shunter.engine.config import ModelSpec, RotationConfig
from shunter.engine.memory.arena import FREE, OwnerKind
from shunter.engine.memory.kv_memory import KVMemory, NoRoom
from shunter.engine.plan import StepPlan
from shunter.engine.request import Request, RequestState
from tests.engine.fakes import TINY, request, tiny_config

ALWAYS = RotationConfig(eager=True, budget_blocks=100, watermark=0.0)
NEVER = RotationConfig(eager=False)


class Harness:
    """A KVMemory plus the requests it serves, stepping plans by hand."""

    def __init__(self, kv_blocks: int, rotation: RotationConfig = NEVER, **kw: object) -> None:
        self.memory = KVMemory(tiny_config(kv_blocks=kv_blocks, rotation=rotation, **kw))  # type: ignore[arg-type]
        self.requests: list[Request] = []
        self.step = 0
        self.plan = StepPlan(step=0)
        self.memory.begin_step(self.plan)

    def next_step(self, complete: bool = True) -> StepPlan:
        """End the current plan (optionally completing its copies) and start the next."""
        done = self.plan
        self.memory.end_step()
        if complete:
            self.memory.complete([done.step])
        self.step += 1
        self.plan = StepPlan(step=self.step)
        self.memory.begin_step(self.plan)
        self.check()
        return done

    def running(self, rid: str, prompt: int, computed: int, model: str = "tiny") -> Request:
        r = request(rid, prompt, 8, model=model)
        self.requests.append(r)
        self.memory.allocate(r)
        r.state = RequestState.RUNNING
        r.num_computed_tokens = computed
        self.memory.mark_computed(r)
        return r

    def swap_out(self, r: Request) -> None:
        self.memory.swap_out(r)
        r.state = RequestState.ROTARY

    def swap_in(self, r: Request) -> None:
        self.memory.swap_in(r)
        r.state = RequestState.RUNNING

    def check(self) -> None:
        self.memory.check_integrity(
            r for r in self.requests if r.state is not RequestState.FINISHED
        )


def test_allocate_append_free_keep_free_plus_used_equal_total() -> None:
    h = Harness(kv_blocks=6)
    m = h.memory
    r = h.running("a", prompt=5, computed=0)  # 2 blocks of 4 tokens
    assert m.num_free_blocks("tiny") == 4 and m.blk(r) == 2
    r.num_computed_tokens = 5
    m.mark_computed(r)
    assert m.can_append(r, 3) and m.can_append(r, 19) and not m.can_append(r, 20)
    m.append(r, 4)  # tokens 5..8 need a third block
    assert m.blk(r) == 3 and m.num_free_blocks("tiny") == 3
    h.check()
    m.free(r)
    r.state = RequestState.FINISHED
    assert m.num_free_blocks("tiny") == 6
    h.check()


def test_blocks_become_synced_when_full_and_written_blocks_lose_host_copies() -> None:
    h = Harness(kv_blocks=8)
    r = h.running("a", prompt=10, computed=10)
    h.swap_out(r)  # 3 blocks: 2 SYNCED, 1 DIRTY; all copied
    assert len(h.plan.swap_out["tiny"]) == 3
    h.next_step()
    h.swap_in(r)
    h.next_step()
    r.num_computed_tokens = 11  # one more token lands in the DIRTY third block
    h.memory.mark_computed(r)
    h.swap_out(r)
    # Only the rewritten DIRTY block is copied: SYNCED host copies stay valid.
    assert h.plan.swap_out["tiny"].hosts == [2] and len(h.plan.swap_out["tiny"].devices) == 1
    h.next_step()


def test_eager_rotation_then_preemption_copies_only_the_dirty_block() -> None:
    h = Harness(kv_blocks=8, rotation=ALWAYS)
    r = h.running("a", prompt=10, computed=10)
    assert h.memory.rotate() == 2  # the two SYNCED blocks
    assert h.memory.rotate() == 0  # each block is rotated once
    h.next_step()
    free_before = h.memory.num_free_blocks("tiny")
    h.swap_out(r)
    assert len(h.plan.swap_out["tiny"]) == 1
    # The two rotated blocks are freed at once; the DIRTY one when its copy lands.
    assert h.memory.num_free_blocks("tiny") == free_before + 2
    assert not h.memory.has_landed(r)
    h.next_step()
    assert h.memory.num_free_blocks("tiny") == free_before + 3
    assert h.memory.has_landed(r)


def test_rotation_stays_off_below_the_watermark_and_within_its_budget() -> None:
    h = Harness(kv_blocks=8, rotation=RotationConfig(budget_blocks=1, watermark=0.5))
    h.running("a", prompt=12, computed=12)  # 3 of 8 blocks used: below half
    assert h.memory.rotate() == 0
    h.running("b", prompt=4, computed=4)  # 4 of 8: at the watermark
    assert h.memory.rotate() == 1
    assert h.memory.rotate() == 1
    h.next_step()


def test_preempting_a_block_still_rotating_waits_for_that_copy() -> None:
    h = Harness(kv_blocks=8, rotation=ALWAYS)
    r = h.running("a", prompt=8, computed=8)
    assert h.memory.rotate() == 2
    h.swap_out(r)  # same step: the rotation copies are in flight, nothing new to copy
    assert "tiny" not in h.plan.swap_out
    assert h.memory.num_free_blocks("tiny") == 6
    assert not h.memory.can_swap_in(r)
    with pytest.raises(RuntimeError):
        h.memory.swap_in(r)
    h.next_step()
    assert h.memory.num_free_blocks("tiny") == 8 and h.memory.can_swap_in(r)


def test_swap_out_answers_whether_its_copies_have_landed() -> None:
    h = Harness(kv_blocks=8, rotation=ALWAYS)
    rotated = h.running("a", prompt=8, computed=8)
    assert h.memory.rotate() == 2
    h.next_step()
    dirty = h.running("b", prompt=6, computed=6)
    assert h.memory.swap_out(rotated)  # every block has a landed host copy: nothing to copy
    assert not h.memory.swap_out(dirty)  # copied this step
    assert h.memory.has_landed(rotated) and not h.memory.has_landed(dirty)
    rotated.state = dirty.state = RequestState.ROTARY
    h.next_step()


def test_try_swap_in_is_can_swap_in_then_swap_in() -> None:
    h = Harness(kv_blocks=4)
    a = h.running("a", prompt=8, computed=8)  # 2 blocks
    h.swap_out(a)
    assert not h.memory.try_swap_in(a)  # its copies have not landed
    assert "tiny" not in h.plan.swap_in and h.memory.num_free_blocks("tiny") == 2
    h.next_step()
    b = h.running("b", prompt=12, computed=12)  # 3 of 4 blocks: a's 2 do not fit
    assert not h.memory.can_swap_in(a) and not h.memory.try_swap_in(a)
    assert "tiny" not in h.plan.swap_in and h.memory.num_free_blocks("tiny") == 1
    h.swap_out(b)
    h.next_step()
    assert h.memory.can_swap_in(a) and h.memory.try_swap_in(a)
    a.state = RequestState.RUNNING
    assert len(h.plan.swap_in["tiny"]) == 2 and h.memory.blk(a) == 2
    assert not h.memory.is_resident(a)
    h.next_step()
    assert h.memory.is_resident(a)


def test_no_h2d_into_a_block_whose_d2h_is_pending() -> None:
    h = Harness(kv_blocks=3)
    a = h.running("a", prompt=8, computed=8)  # 2 blocks
    b = h.running("b", prompt=4, computed=4)  # 1 block
    h.swap_out(b)
    h.next_step()
    h.swap_out(a)  # both of a's blocks have D2H copies in flight
    sources = set(h.plan.swap_out["tiny"].devices)
    # b needs one block: only the block that was never a D2H source qualifies.
    assert h.memory.can_swap_in(b)
    h.swap_in(b)
    (dst,) = h.plan.swap_in["tiny"].devices
    assert dst not in sources
    assert h.memory.num_free_blocks("tiny") == 0
    h.next_step()
    assert h.memory.num_free_blocks("tiny") == 2


def test_free_during_a_copy_defers_until_it_completes() -> None:
    h = Harness(kv_blocks=2, host_blocks=2)
    r = h.running("a", prompt=8, computed=8)
    h.swap_out(r)
    h.memory.free(r)  # aborted while its copies run
    r.state = RequestState.FINISHED
    assert h.memory.num_free_blocks("tiny") == 0
    assert h.memory.host.num_used("tiny") == 2
    h.check()
    h.next_step()
    assert h.memory.num_free_blocks("tiny") == 2
    assert h.memory.host.num_used("tiny") == 0


def test_swap_out_needs_host_space_for_blocks_without_a_host_copy() -> None:
    h = Harness(kv_blocks=4, host_blocks=1)
    r = h.running("a", prompt=8, computed=8)
    assert not h.memory.can_swap_out(r)
    r.num_computed_tokens = 3  # hypothetically less KV: one block to keep
    assert h.memory.can_swap_out(r)
    r.num_computed_tokens = 8


def test_compaction_gives_empty_chunks_back_and_moves_blocks_down() -> None:
    half = dataclasses.replace(TINY, name="half", num_layers=1)  # two blocks per page
    h = Harness(kv_blocks=6, models=(TINY, half))
    m = h.memory
    rs = [h.running(f"r{i}", prompt=4, computed=4, model="half") for i in range(6)]
    assert [m.block_ids(r.id)[0] for r in rs] == [0, 1, 2, 3, 4, 5]  # chunks 0, 1, 2
    for r in (rs[1], rs[2], rs[4], rs[5]):
        m.free(r)
        r.state = RequestState.FINISHED
    held = m.arena.num_free_pages
    # Chunk 2 is empty: back at once. Blocks 1 and 2 are free in chunks 0 and 1, a whole
    # chunk's worth: the top live one (block 3) moves down into block 1.
    assert m.compact("half") == 1
    (move,) = h.plan.moves["half"]
    assert (move.src, move.dst) == (3, 1)
    assert m.block_ids("r3") == [1]
    h.next_step()
    # Chunk 1 drained empty when the move completed and went back then, without another
    # compaction: a drained chunk left held would be capacity no model could use.
    assert m.arena.num_free_pages == held + 2
    assert m.compact("half") == 0
    h.next_step()


def test_compaction_asked_for_some_bytes_gives_back_that_many_empty_chunks_highest_first() -> None:
    h = Harness(kv_blocks=8)
    m = h.memory
    rs = [h.running(f"r{i}", prompt=4, computed=4) for i in range(6)]  # blocks 0..5
    for r in (rs[1], rs[3], rs[4]):
        m.free(r)
        r.state = RequestState.FINISHED
    free_pages = m.arena.num_free_pages
    block = m.block_bytes("tiny")
    # Three empty chunks (one block each); 1.5 blocks' worth asked: the two highest go.
    assert m.compact("tiny", block + block // 2) == 2
    assert m.arena.num_free_pages == free_pages + 2
    assert m.num_held_free_blocks("tiny") == 1  # block 1 stays with its model
    assert not h.plan.moves  # covered by empty chunks: nothing drains, nothing moves
    assert m.compact("tiny", 0) == 0
    assert m.compact("tiny") == 1  # without a figure: every empty chunk
    h.next_step()
    m.allocate(r := request("new", 8, 1))
    r.state = RequestState.RUNNING
    h.requests.append(r)
    assert m.block_ids("new") == [1, 3]  # the lowest free chunks of the arena
    h.next_step()


def test_integrity_check_catches_a_block_owned_twice() -> None:
    h = Harness(kv_blocks=4)
    a = h.running("a", prompt=4, computed=4)
    h.running("b", prompt=4, computed=4)
    h.memory.block_ids("b")[0] = h.memory.block_ids(a.id)[0]
    with pytest.raises(AssertionError):
        h.check()


def test_integrity_check_catches_a_table_that_disagrees_with_the_state() -> None:
    h = Harness(kv_blocks=4)
    r = h.running("a", prompt=4, computed=4)
    r.state = RequestState.WAITING  # a waiting request must own nothing
    with pytest.raises(AssertionError):
        h.check()
    r.state = RequestState.ROTARY  # a rotary one no device block
    with pytest.raises(AssertionError):
        h.check()


def test_models_with_different_block_sizes_share_the_arena() -> None:
    big = ModelSpec(
        "big",
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        hidden_size=32,
        intermediate_size=64,
        vocab_size=128,
    )
    h = Harness(kv_blocks=8, models=(TINY, big))
    m = h.memory
    # Both models may claim any free page: big blocks are twice the bytes.
    assert m.num_total_blocks("tiny") == 2 * m.num_total_blocks("big")
    r = request("x", 8, 4, model="big")
    m.allocate(r)
    r.state = RequestState.RUNNING
    h.requests.append(r)
    s = h.running("s", prompt=4, computed=4)
    kv_pages = {m.arena.owner(p) for p in range(m.arena.num_pages)} - {FREE}
    assert {o.model for o in kv_pages if o.kind is OwnerKind.KV} == {"tiny", "big"}
    assert m.blocks_used() == {"tiny": 1, "big": 2}
    assert m.num_total_blocks("tiny") == 8  # what it could hold: big's KV may go
    assert m.num_free_blocks("tiny") == 8 - 4 - 1  # big holds 4 of the 8 pages
    h.check()
    m.free(r)
    m.free(s)
    r.state = s.state = RequestState.FINISHED
    assert m.release_empty("big") == 4 and m.release_empty("tiny") == 1
    assert m.arena.num_free_pages == 8


def test_blocks_an_h2d_copy_still_writes_are_not_freed_by_a_preemption() -> None:
    h = Harness(kv_blocks=4)
    r = h.running("a", prompt=8, computed=8)
    h.swap_out(r)
    h.next_step()
    h.swap_in(r)  # H2D into two fresh blocks
    h.next_step(complete=False)
    h.swap_out(r)  # preempted again before the H2D copies are reported done
    assert "tiny" not in h.plan.swap_out  # host copies are still valid: nothing to copy
    assert h.memory.num_free_blocks("tiny") == 2
    h.memory.complete([h.step - 1])
    assert h.memory.num_free_blocks("tiny") == 4
    h.next_step()


OTHER = dataclasses.replace(TINY, name="other")


def test_a_model_is_added_into_free_pages_and_removed_leaving_the_others_as_they_are() -> None:
    h = Harness(kv_blocks=120)
    m = h.memory
    a = h.running("a", prompt=8, computed=8)
    blocks, total = list(m.block_ids("a")), m.num_total_blocks("tiny")
    m.check_room([(OTHER, 16)], (), h.requests)
    layout = m.add_model(OTHER)
    h.check()
    weight_pages = layout.num_pages
    assert m.arena.counts()[FREE] == 120 - 2 - weight_pages
    assert all(m.arena.owner(p).model == "other" for r in layout.layers for p in r)
    assert m.block_ids("a") == blocks and a.state is RequestState.RUNNING
    assert m.num_total_blocks("tiny") == total - weight_pages
    b = h.running("b", prompt=8, computed=8, model="other")
    h.check()
    with pytest.raises(ValueError, match="in use or in flight"):
        m.remove_model("other")
    m.free(b)
    b.state = RequestState.FINISHED
    m.remove_model("other")
    h.check()
    assert m.arena.counts()[FREE] == 118 and m.num_total_blocks("tiny") == total
    assert not any(m.arena.owner(p).model == "other" for p in range(m.arena.num_pages))
    assert m.block_ids("a") == blocks


def test_a_model_that_does_not_fit_is_refused_with_the_numbers() -> None:
    h = Harness(kv_blocks=8)
    m = h.memory
    h.running("a", prompt=8, computed=8)
    before = m.arena.counts()
    with pytest.raises(NoRoom, match=r"needs \d+ bytes of arena pages .* \d+ bytes free"):
        m.check_room([(OTHER, 16)], (), h.requests)
    assert m.arena.counts() == before
    # Room for the weights, not for a live request of the model that stays.
    h = Harness(kv_blocks=120)
    h.running("a", prompt=48, computed=8)  # 12 blocks held, 14 at full length
    with pytest.raises(NoRoom, match="request 'a' of model 'tiny' needs"):
        h.memory.check_room([(OTHER, 16)], (), h.requests)
    # With the model that leaves, its pages are reclaimable.
    h.memory.check_room([(OTHER, 16)], ["tiny"], [])
