"""LVF (SuperInfer Algorithm 1) on hand-built states: every branch, and Fig. 9."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from shunter.engine.request import RequestState
from shunter.engine.sched.lvf import LvfPolicy
from tests.engine.sched.helpers import Book, ids

W, R, S = RequestState.WAITING, RequestState.RUNNING, RequestState.ROTARY


@dataclass
class Case:
    """Requests as (name, state, blocks, times); the expected decision at ``now``."""

    name: str
    requests: list[tuple[str, RequestState, int, dict[str, float]]]
    now: float
    free: int
    xfer: int
    admit: list[str]
    preempt: list[str] = field(default_factory=list)
    slots: int | None = None  # free running slots; None: one for every request


CASES = [
    Case(
        "contention check: everything fits, FCFS by arrival, nobody preempted",
        [
            ("old", R, 4, {"t_run": 0.0}),
            ("w2", W, 2, {"t_arr": 3.0}),
            ("s1", S, 1, {"t_arr": 1.0, "t_last": 2.0}),
            ("w1", W, 1, {"t_arr": 2.0}),
        ],
        now=100.0,
        free=4,
        xfer=0,
        admit=["s1", "w1", "w2"],
    ),
    Case(
        "sort: the largest VLT goes first, whatever the arrival order",
        [
            ("early", W, 2, {"t_arr": 0.0}),  # VLT 10 - 0 - 2.5 = 7.5
            ("rot", S, 2, {"t_arr": 0.0, "t_last": 7.0}),  # VLT 3 * 3 = 9
            ("late", W, 2, {"t_arr": 5.0}),  # VLT 2.5
        ],
        now=10.0,
        free=1,
        xfer=3,
        admit=["rot", "early"],  # left = 4: rot (2), early (2), late no longer fits
        preempt=[],
    ),
    Case(
        "prioritize: a request too big for left is skipped, a smaller later one taken",
        [
            ("big", W, 5, {"t_arr": 0.0}),
            ("small", W, 1, {"t_arr": 1.0}),
            ("run", R, 3, {"t_run": 0.0}),
        ],
        now=10.0,
        free=0,
        xfer=3,
        admit=["small"],
        preempt=["run"],
    ),
    Case(
        "prioritize: VLT 0 (within tolerance) still counts as >= 0",
        [("fresh", W, 1, {"t_arr": 9.0}), ("run", R, 1, {"t_run": 0.0})],
        now=10.0,
        free=0,
        xfer=1,
        admit=["fresh"],
        preempt=["run"],
    ),
    Case(
        "preempt: need <= 0 when the prioritized fit in free blocks",
        [
            ("w", W, 2, {"t_arr": 0.0}),
            ("w_late", W, 9, {"t_arr": 0.0}),
            ("run", R, 5, {"t_run": 0.0}),
        ],
        now=10.0,
        free=2,
        xfer=0,
        admit=["w"],  # left = 2: w fits, w_late does not
    ),
    Case(
        "preempt: from the tail (longest running first) until need is met",
        [
            ("w", W, 3, {"t_arr": 0.0}),
            ("newest", R, 2, {"t_run": 9.0}),
            ("oldest", R, 2, {"t_run": 1.0}),
            ("middle", R, 2, {"t_run": 5.0}),
        ],
        now=10.0,
        free=0,
        xfer=4,
        admit=["w"],
        preempt=["oldest", "middle"],
    ),
    Case(
        "preempt: a running request with VLT 0 (started now) is never preempted",
        [
            ("w", W, 2, {"t_arr": 0.0}),
            ("now", R, 2, {"t_run": 10.0}),
            ("old", R, 1, {"t_run": 2.0}),
        ],
        now=10.0,
        free=0,
        xfer=2,
        admit=["w"],
        preempt=["old"],
    ),
    Case(
        "B_xfer = 0 under contention: only what fits in free blocks, no preemption",
        [("w1", W, 1, {"t_arr": 0.0}), ("w2", W, 2, {"t_arr": 0.0}), ("run", R, 9, {"t_run": 0.0})],
        now=10.0,
        free=1,
        xfer=0,
        admit=["w1"],
    ),
    Case(
        "rotary vs waiting: alpha weighs token gaps above TTFT lag",
        [
            ("wait", W, 1, {"t_arr": 0.0}),  # VLT 10 - 2.5 = 7.5
            ("rot", S, 1, {"t_arr": 0.0, "t_last": 7.0}),  # VLT 3 * 3 = 9
            ("run", R, 1, {"t_run": 3.0}),
        ],
        now=10.0,
        free=0,
        xfer=1,
        admit=["rot"],
        preempt=["run"],
    ),
]


# The running cap, not HBM, limits admission: LVF counts only what the free slots take.
CAP_CASES = [
    Case(
        "cap: free blocks hold the FCFS head that fills the slots: FCFS, no rotation",
        [
            ("run", R, 4, {"t_run": 0.0}),
            ("w_old", W, 1, {"t_arr": 0.0}),
            ("w_big", W, 9, {"t_arr": 1.0}),
            ("s", S, 5, {"t_arr": 0.5, "t_last": 9.0}),
        ],
        now=10.0,
        free=2,  # w_old fits; all three (15 blocks) would not: Algorithm 1 would rotate
        xfer=10,
        slots=1,
        admit=["w_old", "s", "w_big"],
    ),
    Case(
        "cap: no free slot: nothing is rotated, however short memory is",
        [("run", R, 4, {"t_run": 0.0}), ("w", W, 3, {"t_arr": 0.0})],
        now=10.0,
        free=0,
        xfer=10,
        slots=0,
        admit=["w"],
    ),
    Case(
        "cap: memory short for the slot's head: one request prioritized, its blocks freed",
        [
            ("w", W, 2, {"t_arr": 0.0}),  # VLT 7.5; FCFS head of the one slot: no room
            ("w2", W, 2, {"t_arr": 1.0}),  # VLT 6.5
            ("s", S, 3, {"t_arr": 0.0, "t_last": 7.0}),  # VLT 9
            ("old", R, 2, {"t_run": 1.0}),
            ("mid", R, 2, {"t_run": 5.0}),
            ("new", R, 2, {"t_run": 8.0}),
        ],
        now=10.0,
        free=0,
        xfer=10,
        slots=1,
        admit=["s"],  # left = 10 - 3, need = 3 (uncapped: all three, need = 7,
        preempt=["old", "mid"],  # and every running request preempted)
    ),
    Case(
        "cap: two slots: the third largest VLT waits although its blocks fit",
        [
            ("s1", S, 1, {"t_arr": 0.0, "t_last": 6.0}),  # VLT 12
            ("s2", S, 1, {"t_arr": 0.0, "t_last": 7.0}),  # VLT 9
            ("w", W, 1, {"t_arr": 0.0}),  # VLT 7.5
            ("r1", R, 1, {"t_run": 0.0}),
            ("r2", R, 1, {"t_run": 1.0}),
            ("r3", R, 1, {"t_run": 2.0}),
        ],
        now=10.0,
        free=0,
        xfer=3,
        slots=2,
        admit=["s1", "s2"],
        preempt=["r1", "r2"],
    ),
    Case(
        "cap: a slot for every candidate: Algorithm 1 unchanged",
        [
            ("big", W, 5, {"t_arr": 0.0}),
            ("small", W, 1, {"t_arr": 1.0}),
            ("run", R, 3, {"t_run": 0.0}),
        ],
        now=10.0,
        free=0,
        xfer=3,
        slots=2,
        admit=["small"],
        preempt=["run"],
    ),
]


@pytest.mark.parametrize("case", CASES + CAP_CASES, ids=[c.name for c in CASES + CAP_CASES])
def test_lvf_algorithm_1(case: Case) -> None:
    book = Book()
    for name, state, blocks, times in case.requests:
        book.add(name, state, blocks, **times)
    decision = LvfPolicy().schedule(book.state(case.now, case.free, case.xfer, case.slots))
    assert ids(decision.admit) == case.admit
    assert ids(decision.preempt) == case.preempt


def test_fig9_four_requests_hbm_holds_two() -> None:
    """Fig. 9: HBM holds two of four requests; LVF rotates them, lagging ones first."""
    book = Book()
    a = book.add("A", R, t_run=0.0)
    b = book.add("B", R, t_run=0.0)
    c = book.add("C", W, t_arr=0.0)
    d = book.add("D", W, t_arr=1.0)
    lvf = LvfPolicy()

    # t = 1: C and D are within their TTFT tolerance (VLT 0) but still >= 0: LVF makes
    # room for both by rotating out A and B, which have run for 1 s (VLT -1).
    decision = lvf.schedule(book.state(now=1.0, free=0, xfer=2))
    assert ids(decision.admit) == ["C", "D"]
    assert ids(decision.preempt) == ["A", "B"] or ids(decision.preempt) == ["B", "A"]

    # Apply it: A and B are rotary (last token at t = 1), C and D run from t = 1.
    for r in (a, b):
        r.state, r.t_last = S, 1.0
    for r in (c, d):
        r.state, r.t_run = R, 1.0
    # t = 1.2: A and B lag (VLT 3 * 0.2), C and D ran 0.2 s: they swap places.
    decision = lvf.schedule(book.state(now=1.2, free=0, xfer=2))
    assert sorted(ids(decision.admit)) == ["A", "B"]
    assert sorted(ids(decision.preempt)) == ["C", "D"]

    # With only one block of transfer budget per step, one pair rotates at a time: the
    # rotary request with the larger lag (A, last token earlier) against the running
    # request with the smallest VLT (C, running longer).
    a.t_last = 0.9
    c.t_run = 0.8
    decision = lvf.schedule(book.state(now=1.2, free=0, xfer=1))
    assert ids(decision.admit) == ["A"]
    assert ids(decision.preempt) == ["C"]


def test_lvf_preempts_only_requests_whose_kv_host_memory_can_take() -> None:
    book = Book()
    book.add("w", W, 2, t_arr=0.0)
    book.add("oldest", R, 2, t_run=0.0)
    book.add("newer", R, 2, t_run=5.0)
    book.pinned.add("oldest")
    decision = LvfPolicy().schedule(book.state(now=10.0, free=0, xfer=2))
    assert ids(decision.preempt) == ["newer"]
