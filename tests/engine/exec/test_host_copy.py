from __future__ import annotations

import pytest
import torch

from shunter.engine.exec.host_copy import copy_on_this_thread, copy_rows_on_this_thread


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.uint8])
def test_a_copy_moves_every_byte(dtype: torch.dtype) -> None:
    src = (torch.arange(3 * 1000) % 251).to(dtype).view(3, 1000)
    dst = torch.zeros_like(src)
    copy_on_this_thread(dst, src)
    assert torch.equal(dst, src)


def test_a_strided_copy_falls_back_to_torch() -> None:
    src = torch.arange(64, dtype=torch.float32).view(8, 8).t()
    dst = torch.zeros(8, 8)
    copy_on_this_thread(dst, src)
    assert torch.equal(dst, src)


def test_rows_go_to_the_rows_named_and_nowhere_else() -> None:
    src = torch.arange(5 * 2 * 3, dtype=torch.bfloat16).view(5, 2, 3)
    dst = torch.full((6, 2, 3), -1.0, dtype=torch.bfloat16)
    copy_rows_on_this_thread(dst, [4, 0], src, [1, 3])
    assert torch.equal(dst[4], src[1]) and torch.equal(dst[0], src[3])
    assert bool((dst[[1, 2, 3, 5]] == -1).all())


def test_rows_of_another_shape_or_count_are_refused() -> None:
    with pytest.raises(ValueError, match="2 destination rows for 1 source rows"):
        copy_rows_on_this_thread(torch.zeros(4, 2), [0, 1], torch.zeros(4, 2), [0])
    dst = torch.zeros(4, 3)
    # Rows of another shape are torch's to refuse, as indexed assignment does.
    with pytest.raises(RuntimeError):
        copy_rows_on_this_thread(dst, [0], torch.zeros(4, 2), [0])
