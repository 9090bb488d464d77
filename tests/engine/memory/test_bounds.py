"""KV floors and ceilings bound what a model's pool may claim from the free pages."""

from __future__ import annotations

import dataclasses

import pytest

from shunter.engine.config import TenantSpec
from shunter.engine.memory.bounds import KvBounds
from shunter.engine.memory.kv_memory import KVMemory, NoRoom
from tests.engine.fakes import TINY, request, tiny_config

OTHER = dataclasses.replace(TINY, name="other")


def test_room_keeps_the_others_floors_and_its_own_ceiling() -> None:
    bounds = KvBounds(
        [
            TenantSpec("a", kv_floor=300),
            TenantSpec("b", kv_floor=200, kv_ceiling=500),
            TenantSpec("c"),
        ]
    )
    held = {"a": 100, "b": 450, "c": 0}
    assert bounds.room("c", held, free=1000) == 800  # a still lacks 200 of its floor
    assert bounds.room("a", held, free=1000) == 1000  # b holds more than its floor
    assert bounds.room("b", held, free=1000) == 50  # its ceiling
    assert bounds.room("c", held, free=100) == 0
    assert bounds.room("c", held, free=1000, lent={"a": 150}) == 950  # 50 of a's kept
    assert bounds.room("c", held, free=1000, lent={"a": 500}) == 1000  # all of it lent
    assert KvBounds([TenantSpec("x")]).unbounded


def test_a_floor_lent_then_recalled_is_owed_back() -> None:
    block = TINY.block_bytes(4)  # one block per page in tiny_config
    config = tiny_config(
        kv_blocks=10, models=(TINY, OTHER), tenants=(TenantSpec("tiny", kv_floor=6 * block),)
    )
    memory = KVMemory(config)
    assert memory.kept_floor_bytes("tiny") == 6 * block and memory.num_free_blocks("other") == 4
    memory.lend_floors({"tiny": 2 * block})
    assert memory.kept_floor_bytes("tiny") == 4 * block and memory.num_free_blocks("other") == 6
    memory.allocate(request("r", 24, 4, model="other"))  # 6 blocks: 2 of tiny's floor
    assert memory.floor_debt() == 0 and memory.beyond_floor_bytes("other") == 6 * block
    memory.lend_floors({})  # recalled: 2 blocks owed back
    assert memory.floor_debt() == 2 * block and memory.num_free_blocks("other") == 0
    assert memory.num_free_blocks("tiny") == 4  # the free pages, all of them its floor's


def test_a_suspended_floor_keeps_nothing_and_is_owed_back_once_it_holds_again() -> None:
    block = TINY.block_bytes(4)  # one block per page in tiny_config
    config = tiny_config(
        kv_blocks=10, models=(TINY, OTHER), tenants=(TenantSpec("tiny", kv_floor=6 * block),)
    )
    memory = KVMemory(config)
    memory.allocate(request("t", 8, 4, model="tiny"))  # 2 blocks of its floor in use
    assert not memory.above_floor("tiny") and memory.num_free_blocks("other") == 4
    memory.suspend_floors(["tiny"])
    # What it holds is beyond its floor (others may rotate it out), and the rest of the
    # floor is not kept for it: the 8 free pages are the other model's to take.
    assert memory.above_floor("tiny") and memory.beyond_floor_bytes("tiny") == 2 * block
    assert memory.kept_floor_bytes("tiny") == 0 and memory.num_free_blocks("other") == 8
    memory.allocate(request("o", 24, 4, model="other"))  # 6 blocks: 2 of tiny's floor
    assert memory.floor_debt() == 0
    memory.suspend_floors([])  # it holds again: 2 blocks owed back
    assert memory.floor_debt() == 2 * block and memory.num_free_blocks("other") == 0
    assert not memory.above_floor("tiny") and memory.kept_floor_bytes("tiny") == 4 * block


def test_a_model_served_again_lends_nothing_of_its_floor_yet() -> None:
    block = TINY.block_bytes(4)
    config = tiny_config(
        kv_blocks=10, models=(TINY, OTHER), tenants=(TenantSpec("tiny", kv_floor=6 * block),)
    )
    memory = KVMemory(config)
    memory.lend_floors({"tiny": 2 * block})
    memory.remove_model("tiny")
    memory.add_model(TINY)
    assert memory.kept_floor_bytes("tiny") == 6 * block and memory.num_free_blocks("other") == 4


def test_pools_claim_within_floors_and_ceilings() -> None:
    block = TINY.block_bytes(4)  # one block per page in tiny_config
    config = tiny_config(
        kv_blocks=10,
        models=(TINY, OTHER),
        tenants=(
            TenantSpec("tiny", kv_floor=4 * block),
            TenantSpec("other", kv_ceiling=3 * block),
        ),
    )
    memory = KVMemory(config)
    # The arena has room for 10 blocks; 4 are kept for tiny, and other stops at 3.
    assert memory.num_free_blocks("other") == 3
    assert memory.num_free_blocks("tiny") == 10
    assert memory.num_total_blocks("other") == 3 and memory.num_total_blocks("tiny") == 10
    # What can ever run is asked of memory: 3 blocks of 4 tokens for other, 10 for tiny.
    assert memory.out_of_reach("other", 12) is None
    assert memory.out_of_reach("other", 13) == (4, 3)
    assert memory.out_of_reach("tiny", 13) is None
    r = request("r", 12, 4, model="other")
    memory.allocate(r)
    assert memory.num_free_blocks("tiny") == 7 and memory.num_free_blocks("other") == 0
    assert memory.above_floor("other") and not memory.above_floor("tiny")


def test_spare_memory_is_what_a_model_holds_free_beyond_its_floor() -> None:
    block = TINY.block_bytes(4)
    config = tiny_config(
        kv_blocks=10,
        models=(TINY, OTHER),
        tenants=(TenantSpec("tiny", kv_floor=4 * block), TenantSpec("other")),
    )
    memory = KVMemory(config)
    r = request("r", 24, 4, model="tiny")  # 6 blocks: 2 beyond its floor
    memory.allocate(r)
    assert memory.spare_bytes("tiny") == 0  # all in use
    memory.free(r)
    assert memory.num_held_free_blocks("tiny") == 6
    assert memory.spare_bytes("tiny") == 2 * block  # the 4 of its floor stay its own
    assert memory.spare_bytes("other") == 0  # holds nothing


def test_floors_must_fit_the_pages_the_weights_leave() -> None:
    block = TINY.block_bytes(4)  # one block per page: 10 pages of KV
    fitting = (TenantSpec("tiny", kv_floor=6 * block), TenantSpec("other", kv_floor=4 * block))
    memory = KVMemory(tiny_config(kv_blocks=10, models=(TINY, OTHER), tenants=fitting))
    over = [TenantSpec("tiny", kv_floor=6 * block), TenantSpec("other", kv_floor=5 * block)]
    with pytest.raises(ValueError, match="floors add up to"):
        KVMemory(tiny_config(kv_blocks=10, models=(TINY, OTHER), tenants=tuple(over)))
    with pytest.raises(ValueError, match=f"arena has {10 * block} bytes of KV pages"):
        memory.set_bounds(KvBounds(over))
    assert memory.bounds.floors == {"tiny": 6 * block, "other": 4 * block}  # unchanged


def test_an_added_models_floor_counts_with_its_weights() -> None:
    block = TINY.block_bytes(4)
    tenants = (TenantSpec("tiny", kv_floor=4 * block),)
    # Room for OTHER's weights and 10 blocks of KV besides them.
    weights = KVMemory(tiny_config(kv_blocks=0, models=(OTHER,))).arena.num_pages
    memory = KVMemory(tiny_config(kv_blocks=10 + weights, tenants=tenants))
    memory.check_room([(OTHER, 16)], (), (), {"other": 6 * block})
    with pytest.raises(NoRoom, match="floors add up to"):
        memory.check_room([(OTHER, 16)], (), (), {"other": 7 * block})
    # The added model's own floor is its, not kept from it.
    memory.check_room([(OTHER, 6 * 4)], (), (), {"other": 6 * block})
    with pytest.raises(NoRoom, match="bytes of KV for"):
        memory.check_room([(OTHER, 7 * 4)], (), (), {"other": 6 * block})
    memory.set_bounds(KvBounds([*tenants, TenantSpec("other", kv_floor=10 * block)]))
    with pytest.raises(ValueError, match="floors add up to"):
        memory.add_model(OTHER)  # its weights would take pages the floors need
    assert "other" not in memory.weights
