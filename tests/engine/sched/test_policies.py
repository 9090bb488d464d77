"""The baselines of SuperInfer §3.1 behind the same interface: FCFS, WF, SF."""

from __future__ import annotations

import pytest

from shunter.engine.config import POLICIES, SchedulerConfig
from shunter.engine.request import RequestState
from shunter.engine.sched.fcfs import FcfsPolicy
from shunter.engine.sched.fixed_order import SwappedFirstPolicy, WaitingFirstPolicy
from shunter.engine.sched.policies import POLICY_CLASSES, make_policy
from tests.engine.sched.helpers import Book, ids

W, R, S = RequestState.WAITING, RequestState.RUNNING, RequestState.ROTARY


def book_with_backlog() -> Book:
    """Two running, one rotary that arrived first, two waiting; memory nearly full."""
    book = Book()
    book.add("run_old", R, 2, t_arr=0.0, t_run=0.0)
    book.add("run_new", R, 2, t_arr=4.0, t_run=4.0)
    book.add("rot", S, 2, t_arr=1.0, t_last=5.0)
    book.add("w_a", W, 1, t_arr=2.0)
    book.add("w_b", W, 3, t_arr=3.0)
    return book


def test_fcfs_admits_by_arrival_and_stops_at_the_first_that_does_not_fit() -> None:
    decision = FcfsPolicy().schedule(book_with_backlog().state(now=10.0, free=3, xfer=99))
    assert ids(decision.admit) == ["rot", "w_a"]  # w_b (3) no longer fits in 3 - 2 - 1
    assert decision.preempt == []
    # Head-of-line blocking: the rotary request first in line does not fit in 1 block,
    # so the waiting request behind it waits too.
    decision = FcfsPolicy().schedule(book_with_backlog().state(now=10.0, free=1, xfer=99))
    assert decision.admit == []


def test_waiting_first_preempts_latest_arrivals_for_new_requests() -> None:
    decision = WaitingFirstPolicy().schedule(book_with_backlog().state(now=10.0, free=1, xfer=99))
    assert ids(decision.admit) == ["w_a", "w_b"]
    # w_b needs 3 blocks, 0 are left: run_new frees 2, not enough; run_old frees 2 more.
    assert ids(decision.preempt) == ["run_new", "run_old"]
    # Rotary requests resume only after every waiting request got in, into free blocks.
    decision = WaitingFirstPolicy().schedule(book_with_backlog().state(now=10.0, free=6, xfer=99))
    assert ids(decision.admit) == ["w_a", "w_b", "rot"]
    assert decision.preempt == []


def test_waiting_first_skips_running_requests_the_host_cannot_take() -> None:
    book = book_with_backlog()
    book.pinned.add("run_new")
    decision = WaitingFirstPolicy().schedule(book.state(now=10.0, free=1, xfer=99))
    assert ids(decision.preempt) == ["run_old"]
    assert ids(decision.admit) == ["w_a"]


def test_waiting_first_preemption_is_bounded_by_the_transfer_budget() -> None:
    decision = WaitingFirstPolicy().schedule(book_with_backlog().state(now=10.0, free=0, xfer=1))
    assert decision.admit == [] and decision.preempt == []


def test_swapped_first_resumes_rotary_before_any_waiting_request() -> None:
    decision = SwappedFirstPolicy().schedule(book_with_backlog().state(now=10.0, free=3, xfer=99))
    assert ids(decision.admit) == ["rot", "w_a"]
    # The rotary request does not fit: waiting requests do not start either.
    decision = SwappedFirstPolicy().schedule(book_with_backlog().state(now=10.0, free=1, xfer=99))
    assert decision.admit == []
    assert decision.preempt == []


@pytest.mark.parametrize("name", ["fcfs", "wf", "sf", "lvf", "lvf+", "lvf+shed"])
def test_make_policy_by_config_name(name: str) -> None:
    assert make_policy(SchedulerConfig(policy=name).policy).name == name
    assert set(POLICY_CLASSES) == set(POLICIES) == {"fcfs", "wf", "sf", "lvf", "lvf+", "lvf+shed"}
    # Only the LVF family decides over every model at once and rotates by choice.
    assert make_policy(name).rotates == name.startswith("lvf")


def test_unknown_policy_is_rejected() -> None:
    with pytest.raises(ValueError):
        make_policy("sjf")
    with pytest.raises(ValueError):
        SchedulerConfig(policy="sjf")
