"""Prefix caching in the memory layer: block hashes, shared and cached blocks in the
pool, and KVMemory serving a prompt's cached prefix."""

from __future__ import annotations

import dataclasses

from shunter.engine.memory.arena import Arena
from shunter.engine.memory.host import HostSwap
from shunter.engine.memory.pool import BlockPool
from shunter.engine.memory.prefix import block_hashes, chain_start
from shunter.engine.request import Request, RequestState
from tests.engine.fakes import SLO, TINY
from tests.engine.memory.test_kv_memory import ALWAYS, Harness

RUNNING, FINISHED = RequestState.RUNNING, RequestState.FINISHED


def test_block_hashes_chain_over_every_earlier_token_and_the_salt() -> None:
    start = chain_start("m", None)
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, start)
    assert len(a) == 2  # the partial third block has no hash
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, start) == a
    # Same second block after a different first: a different hash.
    b = block_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4, start)
    assert b[1] != a[1]
    assert block_hashes([1, 2, 3, 4], 4, chain_start("m", "tenant-a")) != a[:1]
    assert block_hashes([1, 2, 3, 4], 4, chain_start("other", None)) != a[:1]
    # Hashing from a later block continues the chain.
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, a[0], start=1) == a[1:]


def _pool(blocks: int = 8) -> BlockPool:
    arena = Arena(blocks, 1024)
    return BlockPool(arena, "m", 1024)


def test_a_published_block_is_shared_then_cached_free_then_evicted_last() -> None:
    pool = _pool()
    a, b, c = pool.allocate(3)
    pool.publish(a, b"h0")
    pool.publish(b, b"h1")
    assert pool.lookup([b"h0", b"h1", b"h2"]) == [a, b]
    pool.share([a, b])
    assert pool.num_holders(a) == 2 and pool.num_free == 5
    pool.free([a, b, c])  # the first holder leaves: a and b stay used
    assert pool.num_free == 6 and pool.num_cached == 0
    pool.free([a, b])  # the last one: cached, still free and found
    assert pool.num_free == 8 and pool.num_cached == 2
    assert pool.lookup([b"h0", b"h1"]) == [a, b]
    pool.check_integrity(set())
    # Six never-published blocks go before the two cached ones.
    assert not {a, b} & set(pool.allocate(6))
    assert pool.num_cached == 2
    (last,) = pool.allocate(1)  # the tail block goes first
    assert last == b and pool.lookup([b"h0", b"h1"]) == [a]
    pool.check_integrity(set(range(8)) - {a})


def test_sharing_a_cached_block_takes_it_out_of_the_free_blocks() -> None:
    pool = _pool()
    (a,) = pool.allocate(1)
    pool.publish(a, b"h")
    pool.free([a])
    pool.share(pool.lookup([b"h"]))
    assert pool.num_free == 7 and pool.num_cached == 0 and pool.num_holders(a) == 1
    pool.check_integrity({a})
    assert a not in pool.allocate(7)


def test_a_hash_keeps_its_first_block_and_giving_chunks_back_forgets_it() -> None:
    pool = _pool()
    a, b = pool.allocate(2)
    pool.publish(a, b"h")
    pool.publish(b, b"h")  # same KV computed twice: b stays private
    assert pool.lookup([b"h"]) == [a]
    pool.free([a, b])
    assert pool.num_cached == 1
    pool.release_empty()
    assert pool.lookup([b"h"]) == [] and pool.num_cached == 0
    pool.check_integrity(set())


def test_a_draining_chunks_blocks_are_not_served() -> None:
    pool = _pool()
    a, b = pool.allocate(2)
    pool.publish(a, b"ha")
    pool.publish(b, b"hb")
    pool.free([b])
    pool.drain(a)
    pool.drain(b)
    assert pool.lookup([b"ha"]) == [] and pool.lookup([b"hb"]) == []
    assert pool.num_cached == 0
    pool.free([a])  # into its draining chunk: forgotten
    assert pool.lookup([b"ha"]) == []
    pool.check_integrity(set())


def _prompt_request(
    rid: str, prompt: list[int], output: int = 4, salt: str | None = None, model: str = "tiny"
) -> Request:
    return Request(
        id=rid,
        model=model,
        prompt_tokens=len(prompt),
        max_output_tokens=output,
        slo=SLO,
        t_arr=0.0,
        prompt_token_ids=prompt,
        cache_salt=salt,
    )


def _run_prompt(h: Harness, r: Request) -> None:
    """Admit ``r`` and compute its prompt, as a step would."""
    h.requests.append(r)
    h.memory.allocate(r)
    r.state = RUNNING
    r.num_computed_tokens = r.prompt_tokens
    h.memory.mark_computed(r)
    h.check()


def _finish(h: Harness, r: Request) -> None:
    h.memory.free(r)
    r.state = FINISHED
    h.check()


PREFIX = list(range(100, 112))  # three blocks of 4 tokens


def test_a_second_request_shares_the_prefix_and_starts_computed() -> None:
    h = Harness(kv_blocks=16, prefix_caching=True)
    m = h.memory
    a = _prompt_request("a", [*PREFIX, 1, 2])
    _run_prompt(h, a)
    b = _prompt_request("b", [*PREFIX, 7])
    h.requests.append(b)
    m.allocate(b)
    b.state = RUNNING
    assert b.num_computed_tokens == 12
    assert m.block_ids("b")[:3] == m.block_ids("a")[:3]
    assert m.num_free_blocks("tiny") == 16 - 4 - 1  # b only took its fourth block
    h.check()
    _finish(h, a)
    assert m.num_free_blocks("tiny") == 16 - 4  # shared blocks stay with b
    assert m.prefix_stats.queries == {"tiny": 14 + 13} and m.prefix_stats.hits == {"tiny": 12}


def test_the_prompts_last_token_is_always_computed() -> None:
    h = Harness(kv_blocks=16, prefix_caching=True)
    _run_prompt(h, _prompt_request("a", PREFIX))
    b = _prompt_request("b", PREFIX)  # the whole prompt cached: its last block is not
    h.requests.append(b)
    h.memory.allocate(b)
    assert b.num_computed_tokens == 8


def test_finished_prompts_stay_cached_and_a_salt_keeps_them_apart() -> None:
    h = Harness(kv_blocks=16, prefix_caching=True)
    m = h.memory
    a = _prompt_request("a", [*PREFIX, 1], salt="t1")
    _run_prompt(h, a)
    _finish(h, a)
    assert m.num_free_blocks("tiny") == 16
    other = _prompt_request("b", [*PREFIX, 1], salt="t2")
    same = _prompt_request("c", [*PREFIX, 1], salt="t1")
    for r in (other, same):
        h.requests.append(r)
        m.allocate(r)
        r.state = RUNNING
    assert other.num_computed_tokens == 0 and same.num_computed_tokens == 12
    h.check()


def test_output_blocks_are_published_for_the_next_turn() -> None:
    h = Harness(kv_blocks=16, prefix_caching=True)
    m = h.memory
    a = _prompt_request("a", [*PREFIX, 1, 2], output=8)
    _run_prompt(h, a)
    for token in (3, 4, 5):  # decode until the fifth block is full
        a.record_token(0.0, token)
        m.append(a, 1)
        a.num_computed_tokens += 1
        m.mark_computed(a)
    a.record_token(0.0, 6)
    _finish(h, a)
    nxt = _prompt_request("b", [*PREFIX, 1, 2, 3, 4, 5, 6, 9, 9])
    h.requests.append(nxt)
    m.allocate(nxt)
    assert nxt.num_computed_tokens == 16


def test_preempted_to_recompute_finds_its_own_blocks() -> None:
    h = Harness(kv_blocks=16, prefix_caching=True)
    m = h.memory
    a = _prompt_request("a", [*PREFIX, 1, 2])
    _run_prompt(h, a)
    m.free(a)
    a.state, a.num_computed_tokens = RequestState.WAITING, 0
    h.check()
    m.allocate(a)
    a.state = RUNNING
    assert a.num_computed_tokens == 12
    h.check()


def test_compaction_moves_a_shared_block_once_for_all_its_holders() -> None:
    half = dataclasses.replace(TINY, name="half", num_layers=1)  # two blocks per page
    h = Harness(kv_blocks=6, models=(TINY, half), prefix_caching=True)
    m = h.memory
    fillers = [h.running(f"f{i}", prompt=4, computed=4, model="half") for i in range(6)]
    for i in (1, 4):
        _finish(h, fillers[i])
    a = _prompt_request("a", [*PREFIX[:4], 1], model="half")
    _run_prompt(h, a)
    assert m.block_ids("a") == [4, 1]  # its shared block in the top chunk
    for i in (5, 2, 3):
        _finish(h, fillers[i])
    s = _prompt_request("s", [*PREFIX[:4], 2], model="half")
    _run_prompt(h, s)
    assert m.block_ids("s") == [4, 3]
    m.compact("half")  # chunk 2 drains: its one live block moves down, once
    (move,) = h.plan.moves["half"]
    assert move == (4, 2)
    assert m.block_ids("a")[0] == m.block_ids("s")[0] == 2
    h.next_step()
    late = _prompt_request("late", [*PREFIX[:4], 3], model="half")
    h.requests.append(late)
    m.allocate(late)
    late.state = RUNNING
    assert late.num_computed_tokens == 4 and m.block_ids("late")[0] == 2
    h.check()


def test_host_copies_of_a_finished_prompt_serve_a_later_one_after_device_eviction() -> None:
    h = Harness(kv_blocks=6, rotation=ALWAYS, prefix_caching=True)
    m = h.memory
    a = _prompt_request("a", [*PREFIX, 1])  # three full blocks and a partial one
    _run_prompt(h, a)
    assert m.rotate() == 3  # eager rotation copies the full blocks to host
    h.next_step()  # ... and they land
    _finish(h, a)
    assert m.host.num_cached("tiny") == 3 and m.host.used_bytes == 0
    filler = h.running("f", prompt=24, computed=0)  # every device block: cached ones evicted
    _finish(h, filler)
    b = _prompt_request("b", [*PREFIX, 2])
    h.requests.append(b)
    m.allocate(b)
    b.state = RUNNING
    assert b.num_computed_tokens == 12  # from host: three H2D copies in this step
    assert h.plan.swap_in["tiny"].hosts == sorted(h.plan.swap_in["tiny"].hosts)
    assert len(h.plan.swap_in["tiny"].hosts) == 3 and not m.is_resident(b)
    assert m.prefix_stats.host_hits == {"tiny": 12} and m.prefix_stats.hits == {"tiny": 12}
    h.check()
    h.next_step()
    assert m.is_resident(b) and m.host.num_cached("tiny") == 3
    b.num_computed_tokens = 13
    m.mark_computed(b)
    c = _prompt_request("c", [*PREFIX, 3])  # b's loaded blocks are now on the device
    h.requests.append(c)
    m.allocate(c)
    c.state = RUNNING
    assert c.num_computed_tokens == 12 and not h.plan.swap_in
    h.check()


def test_the_host_cache_gives_way_to_swaps_least_recently_freed_first() -> None:
    host = HostSwap(capacity_bytes=400)
    host.register("m", 100)
    a, b, c = host.allocate("m", 3)
    host.publish("m", [a, b], [b"ha", b"hb"])
    host.free("m", [b, a, c])  # b cached first, then a
    assert host.num_free("m") == 4 and host.num_cached("m") == 2 and host.used_bytes == 0
    assert host.allocate("m", 2) == [c, 3]  # the never-cached space first
    assert host.lookup("m", [b"ha"]) == [a]
    (evicted,) = host.allocate("m", 1)
    assert evicted == b and host.lookup("m", [b"hb"]) == []
    host.check_integrity("m", {c, 3, b})
    host.share("m", [a])
    assert host.num_cached("m") == 0 and host.used_bytes == 400
    host.check_integrity("m", {a, b, c, 3})


def _two_sharing_a_prefix() -> tuple[Harness, Request, Request]:
    """Requests a and s whose prompts share PREFIX (three blocks), both computed."""
    h = Harness(kv_blocks=16, prefix_caching=True)
    a = _prompt_request("a", [*PREFIX, 1])
    _run_prompt(h, a)
    s = _prompt_request("s", [*PREFIX, 2])
    _run_prompt(h, s)
    return h, a, s


def test_a_swap_in_shares_the_prefix_blocks_still_on_the_device() -> None:
    h, a, s = _two_sharing_a_prefix()
    m = h.memory
    h.swap_out(s)  # four blocks to host
    h.next_step()
    h.swap_in(s)
    (copies,) = h.plan.swap_in.values()
    assert len(copies) == 1  # the three shared with a stay on the device
    assert m.block_ids("s")[:3] == m.block_ids("a")[:3]
    h.check()
    h.next_step()
    _finish(h, a)
    _finish(h, s)
    assert m.num_free_blocks("tiny") == 16


def test_a_prefix_held_by_a_running_request_takes_no_free_block_to_admit() -> None:
    h = Harness(kv_blocks=5, prefix_caching=True)
    m = h.memory
    a = _prompt_request("a", [*PREFIX, 1])  # four of the five blocks
    _run_prompt(h, a)
    b = _prompt_request("b", [*PREFIX, 2])  # four blocks, three of them a's
    assert m.can_allocate(b)
    h.requests.append(b)
    m.allocate(b)
    b.state = RUNNING
    assert m.num_free_blocks("tiny") == 0 and b.num_computed_tokens == 12
    c = _prompt_request("c", [*PREFIX[:8], 5, 5, 5, 5, 5])  # two shared, two more needed
    assert not m.can_allocate(c)
    h.check()


def test_compaction_evicts_cached_blocks_rather_than_claim_a_chunk() -> None:
    half = dataclasses.replace(TINY, name="half", num_layers=1)  # two blocks per page
    h = Harness(kv_blocks=8, models=(TINY, half), prefix_caching=True)
    m = h.memory
    h.running("f0", prompt=4, computed=4, model="half")
    p = _prompt_request("p", [*PREFIX[:4], 1], model="half")
    _run_prompt(h, p)
    h.running("f1", prompt=8, computed=8, model="half")
    _finish(h, p)  # its head block stays cached, its tail one is free
    h.running("f2", prompt=4, computed=4, model="half")
    assert [m.block_ids(r) for r in ("f0", "f1", "f2")] == [[0], [3, 4], [2]]
    free_pages = m.arena.num_free_pages
    m.compact("half")  # chunk 2 drains: block 4 moves into the cached block 1
    (move,) = h.plan.moves["half"]
    assert move == (4, 1) and m.arena.num_free_pages == free_pages  # nothing claimed
    h.next_step()
    assert m.arena.num_free_pages == free_pages + 1  # chunk 2 went back
    h.check()


def test_a_shared_block_goes_to_host_once_for_all_its_holders() -> None:
    h, a, s = _two_sharing_a_prefix()
    m = h.memory
    h.swap_out(a)
    assert len(h.plan.swap_out["tiny"]) == 4
    h.next_step()  # a's copies land: its full blocks' copies join the host tier
    h.swap_out(s)
    assert len(h.plan.swap_out["tiny"]) == 1  # only its own last block
    assert m.host.num_used("tiny") == 5
    h.check()
    h.next_step()
    h.swap_in(s)
    h.next_step()
    _finish(h, s)
    h.swap_in(a)
    h.next_step()
    _finish(h, a)
    assert m.host.used_bytes == 0 and m.host.num_cached("tiny") == 3


def test_the_host_copy_of_a_partly_computed_prompt_block_is_not_published() -> None:
    h = Harness(kv_blocks=16, prefix_caching=True)
    m = h.memory
    a = _prompt_request("a", [*PREFIX, 1])
    h.requests.append(a)
    m.allocate(a)
    a.state = RUNNING
    a.num_computed_tokens = 10  # a chunk: blocks 0 and 1 full, block 2 half written
    m.mark_computed(a)
    h.swap_out(a)  # its three blocks go to host, block 2 as it is
    h.next_step()
    hashes = block_hashes(PREFIX, 4, chain_start("tiny", None))
    assert len(m.host.lookup("tiny", hashes)) == 2
    h.check()
