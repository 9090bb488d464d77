"""Page ownership, weight placement, and per-model block pools over the arena."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shunter.engine.config import ModelSpec
from shunter.engine.memory.arena import FREE, Arena, OwnerKind, PageOwner
from shunter.engine.memory.pool import BlockPool
from shunter.engine.memory.weights import place_weights


def test_convert_moves_pages_between_owners_and_counts_free_pages() -> None:
    arena = Arena(num_pages=8, page_bytes=1024)
    w = PageOwner.weights("m", 0)
    arena.convert(range(4, 8), FREE, w)
    assert arena.num_free_pages == 4
    # A weight layer's pages go to the KV cache (via FREE) and back.
    arena.convert([6, 7], w, FREE)
    arena.convert([6, 7], FREE, PageOwner.kv("m"))
    assert arena.counts()[PageOwner.kv("m")] == 2
    arena.convert([6, 7], PageOwner.kv("m"), FREE)
    arena.convert([6, 7], FREE, w)
    assert arena.pages_of(w) == [4, 5, 6, 7]
    assert arena.num_free_pages == 4
    arena.check_integrity()


def test_convert_checks_every_page_before_changing_any() -> None:
    arena = Arena(num_pages=4, page_bytes=1024)
    arena.convert([2], FREE, PageOwner.kv("m"))
    version = arena.version
    with pytest.raises(ValueError):
        arena.convert([1, 2], FREE, PageOwner.kv("x"))
    assert arena.owner(1) is FREE and arena.version == version
    with pytest.raises(ValueError):
        arena.convert([0, 0], FREE, PageOwner.kv("x"))
    with pytest.raises(IndexError):
        arena.convert([4], FREE, PageOwner.kv("x"))


def test_find_free_run() -> None:
    arena = Arena(num_pages=6, page_bytes=1)
    arena.convert([2], FREE, PageOwner.kv("m"))
    assert arena.find_free_run(2) == 0
    assert arena.find_free_run(3) == 3
    assert arena.find_free_run(2, from_top=True) == 4
    assert arena.find_free_run(4) is None


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.booleans(), min_size=1, max_size=40), st.integers(1, 8), st.booleans())
def test_find_free_run_is_the_lowest_or_highest_start_of_a_free_run(
    taken: list[bool], num_pages: int, from_top: bool
) -> None:
    arena = Arena(num_pages=len(taken), page_bytes=1)
    arena.convert([p for p, t in enumerate(taken) if t], FREE, PageOwner.kv("m"))
    starts = [s for s in range(len(taken) - num_pages + 1) if not any(taken[s : s + num_pages])]
    expected = (max(starts) if from_top else min(starts)) if starts else None
    assert arena.find_free_run(num_pages, from_top=from_top) == expected


def test_weights_sit_on_top_one_run_of_pages_per_layer() -> None:
    spec = ModelSpec(
        "m",
        num_layers=3,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
        hidden_size=8,
        intermediate_size=16,
        vocab_size=32,
    )
    page = 256
    arena = Arena(num_pages=64, page_bytes=page)
    layout = place_weights(arena, [spec])["m"]
    per_layer = -(-spec.layer_bytes // page)
    assert all(len(r) == per_layer for r in layout.layers)
    assert layout.other.stop == 64
    assert arena.num_free_pages == 64 - layout.num_pages
    for i, run in enumerate(layout.layers):
        assert all(arena.owner(p) == PageOwner.weights("m", i) for p in run)
    with pytest.raises(ValueError):
        place_weights(Arena(num_pages=2, page_bytes=page), [spec])


@pytest.mark.parametrize(
    ("block_bytes", "page_bytes", "pages_per_chunk", "blocks_per_chunk"),
    [
        (2048, 2048, 1, 1),  # Llama-3-8B at 16 tokens: 2 MiB blocks in 2 MiB pages
        (4096, 2048, 2, 1),  # Qwen2.5-32B: a 4 MiB block spans two pages
        (512, 2048, 1, 4),
        (1600, 256, 25, 4),  # 12.5 MiB blocks (OPT-13B) in 2 MiB pages: lcm 50 MiB
    ],
)
def test_pool_geometry_when_blocks_and_pages_do_not_divide(
    block_bytes: int, page_bytes: int, pages_per_chunk: int, blocks_per_chunk: int
) -> None:
    arena = Arena(num_pages=pages_per_chunk * 4 - 1, page_bytes=page_bytes)  # 3 whole chunks
    pool = BlockPool(arena, "m", block_bytes)
    assert (pool.pages_per_chunk, pool.blocks_per_chunk) == (pages_per_chunk, blocks_per_chunk)
    assert pool.num_free == pool.num_total == 3 * blocks_per_chunk
    blocks = pool.allocate(blocks_per_chunk + 1)
    assert blocks == list(range(blocks_per_chunk + 1))  # the lowest chunks first
    assert pool.held_chunks == [0, 1]
    # Block b covers bytes [b * block_bytes, (b + 1) * block_bytes): inside KV pages.
    for b in blocks:
        for p in range(
            b * block_bytes // page_bytes, ((b + 1) * block_bytes - 1) // page_bytes + 1
        ):
            assert arena.owner(p) == PageOwner.kv("m")
    pool.check_integrity(set(blocks))
    with pytest.raises(MemoryError):
        pool.allocate(pool.num_free + 1)


def test_two_models_share_one_arena() -> None:
    arena = Arena(num_pages=8, page_bytes=1000)
    a = BlockPool(arena, "a", 500)  # two blocks per page
    b = BlockPool(arena, "b", 2000)  # one block per two pages
    assert (a.num_free, b.num_free) == (16, 4)
    a_blocks = a.allocate(3)  # claims pages 0 and 1
    assert b.num_free == 3  # chunk 0 of b (pages 0-1) is gone
    b_blocks = b.allocate(1)
    assert b_blocks == [1] and arena.owner(2).model == "b" and arena.owner(3).model == "b"
    assert a.num_free == 1 + 8  # the rest of page 1, and pages 4-7
    a.free(a_blocks)
    a.release(0)
    a.release(1)
    assert b.num_free == 4 - 1
    assert {arena.owner(p).kind for p in range(8)} == {OwnerKind.FREE, OwnerKind.KV}
    with pytest.raises(ValueError):
        b.release(1)  # still used
    a.check_integrity(set())
    b.check_integrity({1})


def test_the_arena_counts_fully_free_chunks_of_every_tracked_size() -> None:
    arena = Arena(num_pages=9, page_bytes=100)
    arena.track_chunks(1)
    arena.track_chunks(3)
    assert (arena.num_free_chunks(1), arena.num_free_chunks(3)) == (9, 3)
    arena.convert([4], FREE, PageOwner.kv("m"))
    assert (arena.num_free_chunks(1), arena.num_free_chunks(3)) == (8, 2)
    assert arena.claim_chunks(3, 2, PageOwner.kv("m")) == [0, 2]  # the lowest free ones
    taken = [*range(0, 3), *range(6, 9)]
    assert all(arena.owner(p) == PageOwner.kv("m") for p in taken)
    assert (arena.num_free_chunks(1), arena.num_free_chunks(3)) == (2, 0)
    arena.check_integrity()
    arena.convert([4], PageOwner.kv("m"), FREE)
    arena.release_chunks(3, [0, 2], PageOwner.kv("m"))  # an equal owner, not the same one
    assert arena.num_free_pages == 9
    assert arena.num_free_chunks(3) == 3
    with pytest.raises(ValueError):
        arena.claim_chunks(3, 4, PageOwner.kv("m"))
    assert arena.num_free_pages == 9
    assert arena.claim_chunks(3, 3, PageOwner.kv("m")) == [0, 1, 2]
    arena.check_integrity()


def test_release_chunks_checks_every_page_before_freeing_any() -> None:
    arena = Arena(num_pages=4, page_bytes=100)
    arena.track_chunks(2)
    kv = PageOwner.kv("m")
    assert arena.claim_chunks(2, 2, kv) == [0, 1]
    arena.convert([3], kv, PageOwner.kv("x"))
    version = arena.version
    with pytest.raises(ValueError):
        arena.release_chunks(2, [0, 1], kv)  # page 3 is not m's
    assert arena.num_free_pages == 0 and arena.version == version
    with pytest.raises(ValueError):
        arena.release_chunks(2, [0, 0], kv)
    arena.release_chunks(2, [0], kv)
    assert arena.num_free_chunks(2) == 1
    arena.check_integrity()
    assert arena.claim_chunks(2, 1, PageOwner.kv("y")) == [0]


def test_a_draining_chunk_allocates_nothing_and_is_released_once_empty() -> None:
    arena = Arena(num_pages=4, page_bytes=1000)
    pool = BlockPool(arena, "m", 500)  # two blocks per chunk
    live = pool.allocate(3)  # chunks 0 and 1
    assert pool.empty_chunks() == []
    pool.drain(1)
    assert pool.num_held_free == 0 and pool.num_free == 4  # chunk 1's free block is out
    other = pool.allocate(1)
    assert other == [4]  # from a fresh chunk, not the draining one
    pool.free([live[2]])  # chunk 1's last live block: it stays out of the free list
    assert pool.num_used_in(1) == 0 and pool.empty_chunks() == [1]
    pool.check_integrity({live[0], live[1], other[0]})
    pool.release(1)
    assert arena.owner(1) is FREE and arena.owner(2) == PageOwner.kv("m")
    pool.drain(0)
    pool.undrain(0)
    assert not pool.is_draining(0)
    pool.check_integrity({live[0], live[1], other[0]})


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(1, 3)), max_size=40))
def test_pages_per_owner_are_counted_as_pages_change_hands(
    ops: list[tuple[int, int, int]],
) -> None:
    arena = Arena(num_pages=24, page_bytes=100)
    arena.track_chunks(3)
    owners = [PageOwner.kv("a"), PageOwner.kv("b"), PageOwner.weights("a", 0)]
    held: dict[PageOwner, list[int]] = {o: [] for o in owners}
    for verb, which, n in ops:
        owner = owners[which % len(owners)]
        if verb == 0 and arena.num_free_chunks(3) >= n:
            held[owner] += arena.claim_chunks(3, n, owner)
        elif verb == 1 and held[owner]:
            arena.release_chunks(3, [held[owner].pop()], owner)
        elif verb == 2:
            free = [p for p in range(arena.num_pages) if arena.owner(p) is FREE][:n]
            arena.convert(free, FREE, owner)
            arena.convert(free, owner, FREE if which % 2 else owner)
        elif verb == 3:
            # A refused change counts nothing.
            with pytest.raises((ValueError, IndexError)):
                arena.convert([arena.num_pages], FREE, owner)
        expected = Counter(arena.owner(p) for p in range(arena.num_pages))
        assert arena.counts() == expected
        arena.check_integrity()
