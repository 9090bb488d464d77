"""Host swap space: one byte budget, per-model block ids."""

from __future__ import annotations

import pytest

from shunter.engine.memory.host import HostSwap


def test_models_share_the_byte_budget_and_recycle_lowest_ids() -> None:
    host = HostSwap(capacity_bytes=1000)
    host.register("a", 100)
    host.register("b", 300)
    assert host.allocate("a", 4) == [0, 1, 2, 3]
    assert host.num_free("b") == 2
    assert host.allocate("b", 2) == [0, 1]
    assert not host.can_allocate("a", 1)
    with pytest.raises(MemoryError):
        host.allocate("a", 1)
    host.free("a", [2, 0])
    assert host.allocate("a", 1) == [0]
    assert host.used_bytes == 3 * 100 + 2 * 300
    host.check_integrity("a", {0, 1, 3})
    host.check_integrity("b", {0, 1})
    with pytest.raises(AssertionError):
        host.check_integrity("a", {0, 1})
