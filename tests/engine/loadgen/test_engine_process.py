"""The benchmark harness's timings and figures, without an engine."""

from __future__ import annotations

import pytest

from shunter.engine.loadgen.engine_process import (
    Timings,
    median_ratio,
    quantile_ms,
    random_prompts,
    ratio,
)


def test_timings_are_the_first_token_and_every_gap_after_it() -> None:
    t = Timings()
    t.add(1.0, [1.25, 1.5, 2.0])
    other = Timings()
    other.add(0.0, [0.5])
    t.extend(other)
    assert t.ttft == [0.25, 0.5]
    assert t.itl == [0.25, 0.5]
    assert t.row(6, 6, 6).split() == ["500.00", "500.00", "500.00"]


def test_quantiles_and_ratios_say_so_when_there_is_nothing_to_show() -> None:
    assert quantile_ms([], 0.5) == "-"
    assert quantile_ms([0.003, 0.001, 0.002], 0.5) == "2.00"
    assert median_ratio([], [1.0]) is None
    assert median_ratio([2.0, 4.0], [1.0, 2.0]) == pytest.approx(2.0)
    assert ratio([0.2], [0.1]) == "2.00x" and ratio([1.0], []) == "-"


def test_random_prompts_are_the_same_every_run() -> None:
    first = random_prompts(3, 5)
    assert first == random_prompts(3, 5)
    assert len(first) == 3 and all(len(p) == 5 for p in first)
    assert all(4 <= token < 500 for p in first for token in p)
