"""StepPlan's copy batches: parallel id lists per model and direction, and their counts."""

from __future__ import annotations

import pytest

from shunter.engine.plan import BlockCopies, StepPlan


def test_copies_pair_device_and_host_ids_in_order() -> None:
    copies = BlockCopies([7, 2], [3, 0])
    copies.extend([9], [1])
    assert len(copies) == 3
    assert copies.pairs() == [(7, 3), (2, 0), (9, 1)]
    assert not BlockCopies() and copies


def test_device_and_host_ids_must_pair_up() -> None:
    with pytest.raises(ValueError, match="2 device blocks for 1 host blocks"):
        BlockCopies([1, 2], [0])
    copies = BlockCopies([1], [0])
    with pytest.raises(ValueError, match="1 device blocks for 2 host blocks"):
        copies.extend([3], [4, 5])
    assert copies.pairs() == [(1, 0)]


def test_d2h_is_preemption_copies_then_rotations_in_a_new_batch() -> None:
    plan = StepPlan(
        step=0,
        swap_out={"a": BlockCopies([4], [0]), "b": BlockCopies([1], [5])},
        rotate={"a": BlockCopies([6, 8], [1, 2])},
        swap_in={"a": BlockCopies([3], [7])},
    )
    assert plan.d2h("a").pairs() == [(4, 0), (6, 1), (8, 2)]
    assert plan.d2h("b").pairs() == [(1, 5)]
    assert len(plan.d2h("absent")) == 0
    only_out = plan.d2h("b")
    only_out.extend([2], [6])  # the caller's batch, not the plan's
    assert plan.swap_out["b"].pairs() == [(1, 5)]
    assert plan.num_d2h_blocks == 4 and plan.num_h2d_blocks == 1 and plan.has_transfers
    assert not StepPlan(step=1, swap_out={"a": BlockCopies()}).has_transfers
