"""The liveness invariant's watch: live requests must emit within its limits."""

from __future__ import annotations

import pytest

from shunter.engine.liveness import NoProgress, ProgressWatch


def test_tokens_or_idleness_reset_the_watch() -> None:
    watch = ProgressWatch(limit_s=1.0, limit_steps=3)
    watch.observe(now=0.5, step=0, num_emitted=0, num_live=2)
    watch.observe(now=0.9, step=1, num_emitted=1, num_live=2)  # progress at 0.9
    watch.observe(now=1.8, step=2, num_emitted=0, num_live=2)
    watch.observe(now=1.9, step=3, num_emitted=0, num_live=0)  # idle: nothing owed
    watch.observe(now=2.8, step=4, num_emitted=0, num_live=1)
    assert watch.num_steps_since == 1


def test_live_requests_without_a_token_past_the_time_limit_raise() -> None:
    watch = ProgressWatch(limit_s=1.0, limit_steps=100)
    watch.rest(10.0)
    watch.observe(now=11.0, step=7, num_emitted=0, num_live=3)  # at the limit: fine
    with pytest.raises(NoProgress, match="step 8: 3 live requests and no token since t = 10"):
        watch.observe(now=11.1, step=8, num_emitted=0, num_live=3)


def test_steps_that_stop_the_clock_are_bounded_too() -> None:
    watch = ProgressWatch(limit_s=1.0, limit_steps=3)
    for step in range(3):
        watch.observe(now=0.0, step=step, num_emitted=0, num_live=1)
    with pytest.raises(NoProgress, match="4 steps ago"):
        watch.observe(now=0.0, step=3, num_emitted=0, num_live=1)


def test_a_wall_clock_watch_counts_no_steps() -> None:
    watch = ProgressWatch(limit_s=1.0, limit_steps=None)
    for step in range(100_000):
        watch.observe(now=0.5, step=step, num_emitted=0, num_live=1)
    with pytest.raises(NoProgress):
        watch.observe(now=1.1, step=100_000, num_emitted=0, num_live=1)
