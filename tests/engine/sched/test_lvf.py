"""LVF (SuperInfer Algorithm 1) on hand-built states: every branch, and Fig. 9."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from shunter.engine.request import RequestState, tbt_slack
from shunter.engine.sched.lvf import (
    LvfPlusPolicy,
    LvfPolicy,
    LvfShedPolicy,
    num_slots_freed,
    time_out,
)
from shunter.engine.sched.policy import Decision, PolicyInput
from shunter.engine.sched.room import Room
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


# Two resources: free blocks and free running slots. A request is prioritized only if a
# slot is free or preempting can free one; preemption stops when both deficits are covered.
# A slot is freed for a request that fits in the free blocks only if it lags (VLT > 0) and
# the victim (the longest running) has run longer than it has lagged; the block path is
# Algorithm 1's.
CAP_CASES = [
    Case(
        "cap: a slot and blocks for every candidate: FCFS by arrival, no rotation",
        [
            ("run", R, 4, {"t_run": 0.0}),
            ("w", W, 2, {"t_arr": 1.0}),
            ("s", S, 1, {"t_arr": 0.5, "t_last": 2.0}),
        ],
        now=10.0,
        free=3,
        xfer=10,
        slots=2,
        admit=["s", "w"],
    ),
    Case(
        "cap: slots full, memory ample: a waiting request within its TTFT tolerance "
        "(VLT 0) frees no slot",
        [
            ("w", W, 1, {"t_arr": 9.0}),  # VLT 0
            ("old", R, 2, {"t_run": 9.5}),  # ran 0.5 s
        ],
        now=10.0,
        free=100,
        xfer=10,
        slots=0,
        admit=[],
    ),
    Case(
        "cap: slots full, memory ample: the longest-running request, having run longer "
        "than the waiting one has lagged, gives up its slot, exactly one",
        [
            ("w", W, 1, {"t_arr": 0.0}),  # VLT 7.5
            ("now", R, 2, {"t_run": 10.0}),  # VLT 0: never preempted
            ("old", R, 2, {"t_run": 2.0}),  # ran 8 s
            ("mid", R, 2, {"t_run": 6.0}),
        ],
        now=10.0,
        free=100,
        xfer=10,
        slots=0,
        admit=["w"],
        preempt=["old"],
    ),
    Case(
        "cap: slots full, memory ample: a VLT above every running request's run time "
        "frees no slot: it waits for one a finishing request frees",
        [
            ("w", W, 1, {"t_arr": 0.0}),  # VLT 7.5
            ("old", R, 2, {"t_run": 3.0}),  # ran 7 s
            ("mid", R, 2, {"t_run": 6.0}),  # ran 4 s
        ],
        now=10.0,
        free=100,
        xfer=10,
        slots=0,
        admit=[],
    ),
    Case(
        "cap: slots full, memory ample: a victim that has run exactly as long as the "
        "request has lagged keeps its slot",
        [("s", S, 1, {"t_arr": 0.0, "t_last": 8.0}), ("old", R, 2, {"t_run": 4.0})],
        now=10.0,  # s: VLT 3 * 2 = 6, old ran 6 s
        free=100,
        xfer=10,
        slots=0,
        admit=[],
    ),
    Case(
        "cap: slots full, memory ample: a rotary request's VLT (alpha times its gap) "
        "below the run time takes the slot",
        [("s", S, 1, {"t_arr": 0.0, "t_last": 7.0}), ("old", R, 2, {"t_run": 0.0})],
        now=10.0,  # s: VLT 3 * 3 = 9 < 10
        free=100,
        xfer=10,
        slots=0,
        admit=["s"],
        preempt=["old"],
    ),
    Case(
        "cap: slots full, memory ample: a rotary request's VLT (alpha times its gap) "
        "above the run time frees no slot, though its gap alone is below it",
        [("s", S, 1, {"t_arr": 0.0, "t_last": 7.0}), ("old", R, 2, {"t_run": 2.0})],
        now=10.0,  # s: gap 3 < 8, VLT 3 * 3 = 9 > 8
        free=100,
        xfer=10,
        slots=0,
        admit=[],
    ),
    Case(
        "cap: the first request refused a slot ends the admissions: a smaller VLT that "
        "would need rotated blocks does not take the slot ahead of it",
        [
            ("s", S, 1, {"t_arr": 0.0, "t_last": 7.0}),  # VLT 9, fits in the free block
            ("big", W, 5, {"t_arr": 0.0}),  # VLT 7.5, needs 4 rotated blocks
            ("r1", R, 1, {"t_run": 2.0}),  # ran 8 s < 9: refuses s its slot
            ("r2", R, 4, {"t_run": 9.0}),
        ],
        now=10.0,
        free=1,
        xfer=10,
        slots=0,
        admit=[],
    ),
    Case(
        "cap: memory ample, one free slot and one preemptible request: the two largest "
        "VLTs are prioritized, the third waits",
        [
            ("s1", S, 1, {"t_arr": 0.0, "t_last": 6.0}),  # VLT 12
            ("s2", S, 1, {"t_arr": 0.0, "t_last": 7.0}),  # VLT 9
            ("w", W, 1, {"t_arr": 0.0}),  # VLT 7.5
            ("r1", R, 1, {"t_run": 0.0}),  # ran 10 s > 9
            ("r2", R, 1, {"t_run": 10.0}),  # VLT 0
        ],
        now=10.0,
        free=100,
        xfer=1,
        slots=1,
        admit=["s1", "s2"],
        preempt=["r1"],
    ),
    Case(
        "cap: slots full, memory ample: slots are freed only while the victims' blocks "
        "stay within B_xfer",
        [
            ("w1", W, 1, {"t_arr": 0.0}),
            ("w2", W, 1, {"t_arr": 1.0}),
            ("w3", W, 1, {"t_arr": 2.0}),
            ("r1", R, 3, {"t_run": 0.0}),  # ran 10 s > w1's VLT 7.5
            ("r2", R, 3, {"t_run": 1.0}),  # ran 9 s > w2's VLT 6.5
            ("r3", R, 3, {"t_run": 2.0}),  # ran 8 s > w3's VLT 5.5
        ],
        now=10.0,
        free=100,
        xfer=4,
        slots=0,
        admit=["w1", "w2"],  # r1 (3 blocks) is within 4, r2 takes the victims to 6
        preempt=["r1", "r2"],
    ),
    Case(
        "cap: slots full, memory ample, B_xfer = 0: no rotation, as without the cap",
        [("w", W, 1, {"t_arr": 0.0}), ("run", R, 2, {"t_run": 0.0})],
        now=10.0,
        free=100,
        xfer=0,
        slots=0,
        admit=[],
    ),
    Case(
        "cap: no free slot, memory short: the waiting request takes the longest-running "
        "request's slot and blocks (Algorithm 1 preempts it for blocks, whatever its run "
        "time)",
        [("run", R, 4, {"t_run": 5.0}), ("w", W, 3, {"t_arr": 0.0})],  # ran 5 s < VLT 7.5
        now=10.0,
        free=0,
        xfer=10,
        slots=0,
        admit=["w"],
        preempt=["run"],
    ),
    Case(
        "cap: one preemption covers the block deficit and the slot deficit at once",
        [
            ("s1", S, 1, {"t_arr": 0.0, "t_last": 6.0}),
            ("s2", S, 1, {"t_arr": 0.0, "t_last": 7.0}),
            ("w", W, 1, {"t_arr": 0.0}),
            ("r1", R, 1, {"t_run": 0.0}),
            ("r2", R, 1, {"t_run": 1.0}),
        ],
        now=10.0,
        free=2,
        xfer=1,
        slots=2,
        admit=["s1", "s2", "w"],
        preempt=["r1"],
    ),
    Case(
        "cap: the slots run out before the blocks: the third largest VLT waits although "
        "its blocks fit in left",
        [
            ("s1", S, 1, {"t_arr": 0.0, "t_last": 6.0}),
            ("s2", S, 1, {"t_arr": 0.0, "t_last": 7.0}),
            ("w", W, 1, {"t_arr": 0.0}),
            ("r1", R, 1, {"t_run": 0.0}),
            ("r2", R, 1, {"t_run": 10.0}),  # VLT 0
        ],
        now=10.0,
        free=1,
        xfer=2,
        slots=1,
        admit=["s1", "s2"],  # left = 3: 1 block left over, no slot for w
        preempt=["r1"],  # need = 1 block and 1 slot
    ),
    Case(
        "cap: the block deficit outlasts the slot deficit: preemption goes on for blocks",
        [
            ("s", S, 3, {"t_arr": 0.0, "t_last": 7.0}),  # VLT 9
            ("w", W, 2, {"t_arr": 0.0}),  # VLT 7.5
            ("w2", W, 2, {"t_arr": 1.0}),  # VLT 6.5
            ("old", R, 2, {"t_run": 1.0}),
            ("mid", R, 2, {"t_run": 5.0}),
            ("new", R, 2, {"t_run": 8.0}),
        ],
        now=10.0,
        free=1,
        xfer=5,
        slots=1,
        admit=["s", "w"],  # left = 6: s, w; w2 no longer fits; one slot short
        preempt=["old", "mid"],  # need = 4 blocks: the slot is covered after old
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


@pytest.mark.parametrize(
    ("lags", "freed"),
    [
        ([1.0, 9.0, 5.0], 3),  # 9 < 10, 5 < 6, 1 < 5
        ([9.0, 7.0, 1.0], 1),  # 9 < 10, 7 > 6: refused
        ([12.0, 5.0], 0),  # 12 > 10: the first refused ends it, though 5 < 6
        ([10.0], 0),  # a run as long as the lag is not longer
        ([0.0, 0.0], 0),  # within tolerance (VLT 0): no lag, no slot
        ([9.0, 5.0, 4.0, 3.0], 3),  # three slots to free, the one at VLT 0 never
    ],
)
def test_num_slots_freed_pairs_the_largest_lags_with_the_longest_runs(
    lags: list[float], freed: int
) -> None:
    book = Book()
    running = [
        book.add("r6", R, t_run=4.0),
        book.add("r10", R, t_run=0.0),
        book.add("r5", R, t_run=5.0),
        book.add("r0", R, t_run=10.0),  # VLT 0
    ]
    assert num_slots_freed(lags, running, now=10.0) == freed


# --- lvf+ ---------------------------------------------------------------------------


WITHIN_TOLERANCE = "prioritize: VLT 0 (within tolerance) still counts as >= 0"


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.name != WITHIN_TOLERANCE], ids=lambda c: c.name
)
def test_lvf_plus_is_algorithm_1_when_memory_binds(case: Case) -> None:
    """With a slot for every request, running requests far ahead of their TBT SLO,
    candidates that cannot miss their TTFT target and no link rate, lvf+ decides as
    Algorithm 1 wherever the free blocks do not hold every candidate, except that
    nobody is rotated out for a candidate that does not lag, and no candidate counts on
    more rotation than the requests preempted hold (Algorithm 1 counts on B_xfer:
    with nobody to preempt it admits what the free blocks cannot hold)."""
    book = Book()
    blocks_of = {}
    for name, state, blocks, times in case.requests:
        r = book.add(name, state, blocks, **times)
        blocks_of[name] = blocks
        if state is R:
            r.t_first_token, r.num_output_tokens = r.t_run, 10**6
        # The same tolerance (beta_F x S_F = 2.5 s), and no TTFT target ever missed.
        r.slo = dataclasses.replace(r.slo, ttft_s=1e6, beta_f=2.5e-6)
    state = book.state(case.now, case.free, case.xfer, case.slots)
    algorithm_1, lvf_plus = LvfPolicy().schedule(state), LvfPlusPolicy().schedule(state)
    admitted = sum(blocks_of[n] for n in ids(algorithm_1.admit))
    freed = sum(blocks_of[n] for n in ids(algorithm_1.preempt))
    if admitted <= case.free + freed:
        assert lvf_plus == algorithm_1
    else:  # Algorithm 1's admissions that fit the free blocks, in its order
        fitting, left = [], case.free
        for n in ids(algorithm_1.admit):
            if blocks_of[n] <= left:
                fitting.append(n)
                left -= blocks_of[n]
        assert ids(lvf_plus.admit) == fitting and ids(lvf_plus.preempt) == []


def test_lvf_plus_counts_on_rotation_only_for_what_its_victims_hold() -> None:
    """Algorithm 1 takes "big" on B_xfer's word and rotates "run" out for it; lvf+
    keeps "run", which has not run long enough to pay for its rotation, so nothing
    would make room for "big": counting on it, "big" would take the free blocks on
    paper and "small", which fits them, would wait behind it. lvf+ admits "small"."""
    book = Book()
    run = book.add("run", R, 4, t_run=9.99)
    run.t_first_token, run.num_output_tokens = 9.99, 10**6
    big = book.add("big", S, 3, t_arr=0.0, t_last=5.0)
    small = book.add("small", W, 1, t_arr=9.0)
    for r in (run, big, small):
        r.slo = dataclasses.replace(r.slo, ttft_s=1e6, beta_f=2.5e-6)
    state = book.state(now=10.0, free=2, xfer=4, step_s=0.05)  # 4 x 50 ms > 10 ms run
    algorithm_1 = LvfPolicy().schedule(state)
    assert ids(algorithm_1.admit) == ["big", "small"] and ids(algorithm_1.preempt) == ["run"]
    decision = LvfPlusPolicy().schedule(state)
    assert ids(decision.admit) == ["small"] and ids(decision.preempt) == []
    # Once "run" has run long enough to go, lvf+ rotates it out for "big".
    decision = LvfPlusPolicy().schedule(book.state(now=20.0, free=2, xfer=4, step_s=0.05))
    assert ids(decision.admit) == ["big", "small"] and ids(decision.preempt) == ["run"]


def test_lvf_plus_rotates_nobody_out_for_a_candidate_within_its_tolerance() -> None:
    """Algorithm 1 rotates "run" out for "fresh" (VLT 0: it waited 1 s of its 2.5 s
    tolerance); lvf+ lets it wait for free blocks, and rotates for it once it lags."""
    book = Book()
    run = book.add("run", R, 1, t_run=0.0)
    run.t_first_token, run.num_output_tokens = 0.0, 10**6
    book.add("fresh", W, 1, t_arr=9.0)
    assert ids(LvfPolicy().schedule(book.state(10.0, 0, 1)).preempt) == ["run"]
    assert LvfPlusPolicy().schedule(book.state(10.0, 0, 1)) == Decision()
    lagging = LvfPlusPolicy().schedule(book.state(12.0, 0, 1))  # VLT 0.5
    assert ids(lagging.preempt) == ["run"] and ids(lagging.admit) == ["fresh"]
    # Free blocks it may take at once.
    assert ids(LvfPlusPolicy().schedule(book.state(10.0, 1, 1)).admit) == ["fresh"]


def test_lvf_plus_rotates_nobody_out_for_a_candidate_whose_first_token_is_late() -> None:
    """A waiting request past its TTFT target (5 s) has nothing left to gain from a
    rotation: lvf+ gives it free blocks only (the first, by its lag), where LVF rotates
    for it; a rotary request with its first token still has its TBT at stake."""
    book = Book()
    run = book.add("run", R, 1, t_run=0.0)
    run.t_first_token, run.num_output_tokens = 0.0, 10**6
    book.add("late", W, 1, t_arr=0.0)  # VLT 7.5 at t = 10, 5 s past its TTFT target
    assert ids(LvfPolicy().schedule(book.state(10.0, 0, 1)).preempt) == ["run"]
    assert LvfPlusPolicy().schedule(book.state(10.0, 0, 1)) == Decision()
    assert ids(LvfPlusPolicy().schedule(book.state(10.0, 1, 1)).admit) == ["late"]
    book.add("back", S, 1, t_arr=0.0, t_last=9.0).t_first_token = 1.0
    plus = LvfPlusPolicy().schedule(book.state(10.0, 0, 1))
    assert ids(plus.preempt) == ["run"] and ids(plus.admit) == ["back"]


def test_lvf_plus_does_not_rotate_for_running_slots_alone() -> None:
    """Memory holds everyone but the cap is full: LVF frees a slot for a request that
    lags more than the oldest has run; lvf+ rotates nobody for a compute limit and
    admits by arrival as slots allow."""
    book = Book()
    old = book.add("old", R, 1, t_run=0.0)
    old.t_first_token, old.num_output_tokens = 0.0, 10**6
    book.add("lagging", W, 1, t_arr=1.0)  # VLT at t = 10: 10 - 1 - 2.5 = 6.5 < 10 run
    book.add("later", W, 1, t_arr=2.0)
    state = book.state(now=10.0, free=8, xfer=8, slots=0)
    assert ids(LvfPolicy().schedule(state).preempt) == ["old"]
    plus = LvfPlusPolicy().schedule(state)
    assert plus.preempt == [] and plus.admit == []
    assert ids(LvfPlusPolicy().schedule(book.state(10.0, 8, 8, slots=1)).admit) == ["lagging"]


def _fig9_second_rotation(tokens: int) -> PolicyInput:
    """Fig. 9 at its second rotation: A and B rotary and lagging, C and D running for
    0.2 s with ``tokens`` tokens each since their first at 1 s; no block free, B_xfer
    of two, a 0.04 s round trip."""
    book = Book()
    book.add("A", S, t_arr=0.0, t_last=1.0)
    book.add("B", S, t_arr=0.0, t_last=1.0)
    for name in ("C", "D"):
        r = book.add(name, R, t_run=1.0)
        r.t_first_token, r.num_output_tokens = 1.0, tokens
    return book.state(now=1.2, free=0, xfer=2, swap_s=lambda r: 0.04)


@pytest.mark.parametrize(
    ("tokens", "rotated"),
    [
        (2, False),  # 2 x 0.1 - 0.2 = 0 s of slack
        (3, False),  # 0.1 s: less than the 0.04 s round trip and a 0.1 s token gap
        (5, False),  # 0.3 s covers both, not the 0.3 s on the host besides
        (7, True),  # 0.5 s covers all three
    ],
)
def test_lvf_plus_rotates_out_only_requests_whose_tbt_slack_covers_the_time_out(
    tokens: int, rotated: bool
) -> None:
    """Fig. 9's second rotation: C and D have run 0.2 s when A and B lag. LVF swaps
    them at once; lvf+ only if their TBT slack covers their time out: the round trip of
    their KV over the link (0.04 s here), the wait on the host until their VLT overtakes
    the most lagging candidate's (A's 0.6 s, growing one a second, against 3 a second
    from 0: 0.3 s) and one token gap (TBT 0.1 s)."""
    state = _fig9_second_rotation(tokens)
    assert sorted(ids(LvfPolicy().schedule(state).preempt)) == ["C", "D"]
    expected = ["C", "D"] if rotated else []
    assert sorted(ids(LvfPlusPolicy().schedule(state).preempt)) == expected


@pytest.mark.parametrize(
    ("ran_s", "rotated"),
    [
        (0.5, False),  # less than 4 x (0.05 s round trip + 0.1 s step) = 0.6 s
        (0.7, True),
    ],
)
def test_lvf_plus_rotates_out_only_requests_that_ran_k_times_what_a_rotation_costs(
    ran_s: float, rotated: bool
) -> None:
    """A rotation costs its request the round trip of its KV and the step it sits out
    while its copies land; lvf+ rotates out only a request that ran at least
    ``SWITCH_COST_FACTOR`` (4) times that since it was brought in, however much TBT
    slack it has, so at most a fifth of its time goes to rotating."""
    book = Book()
    book.add("A", S, t_arr=0.0, t_last=1.0).t_first_token = 0.5
    run = book.add("run", R, t_run=10.0 - ran_s)
    run.t_first_token, run.num_output_tokens = 0.0, 10**6
    state = book.state(now=10.0, free=0, xfer=1, swap_s=lambda r: 0.05, step_s=0.1)
    assert ids(LvfPolicy().schedule(state).preempt) == ["run"]
    assert ids(LvfPlusPolicy().schedule(state).preempt) == (["run"] if rotated else [])


def test_the_time_out_is_until_the_rotated_request_lags_most() -> None:
    r = Book().add("r", R, t_run=0.0)  # alpha 3, beta_B 0, TBT 0.1 s
    assert time_out(r, 0.0) == 0.0  # nobody lags: it comes back when memory frees
    assert time_out(r, 1.0) == pytest.approx(0.5)  # 3 t = 1 + t
    r.slo = dataclasses.replace(r.slo, alpha=1.0)
    assert time_out(r, 1.0) == float("inf")  # never overtakes
    r.slo = dataclasses.replace(r.slo, alpha=3.0, beta_b=2.0)  # 0.2 s before it lags
    assert time_out(r, 1.0) == pytest.approx(0.8)


def test_tbt_slack_is_what_a_mean_per_token_target_leaves() -> None:
    book = Book()
    r = book.add("r", R, t_run=0.0)
    assert tbt_slack(r, now=1.0) == 0.0  # no token yet: its TTFT is at stake
    r.t_first_token, r.num_output_tokens = 1.0, 5  # SLO TBT 0.1 s
    assert tbt_slack(r, now=1.3) == pytest.approx(0.5 - 0.3)
    assert tbt_slack(r, now=2.0) == pytest.approx(-0.5)  # behind: nothing to give


def test_equal_lags_go_to_the_higher_tenant_priority_first() -> None:
    """Two requests within their TTFT tolerance (VLT 0 both) and room for one: LVF takes
    the one given first; with priorities, the higher tenant's."""
    book = Book()
    book.add("low", W, 2, t_arr=0.0)
    book.add("high", W, 2, t_arr=0.5)
    plain = book.state(now=1.0, free=2, xfer=0)
    assert ids(LvfPolicy().schedule(plain).admit) == ["low"]
    ranked = dataclasses.replace(plain, priority=lambda r: 1 if r.id == "high" else 0)
    assert ids(LvfPolicy().schedule(ranked).admit) == ["high"]
    assert ids(LvfPlusPolicy().schedule(ranked).admit) == ["high"]


def test_lvf_plus_preempts_passively_a_request_behind_its_slo_before_the_latest_arrival() -> None:
    """A decode out of blocks preempts the latest arrival under LVF (vLLM's rule); lvf+
    takes a request already behind its SLO first, the latest of those, and the latest
    arrival only when every request can still meet its SLO."""
    book = Book()
    behind = book.add("behind", R, t_arr=0.0, t_run=0.0)
    behind.t_first_token, behind.num_output_tokens = 1.0, 5  # 0.5 s of TBT, 9 s gone
    late = book.add("late", R, t_arr=1.0, t_run=9.0)  # no token 9 s after arrival (TTFT 5 s)
    ahead = book.add("ahead", R, t_arr=2.0, t_run=2.0)
    ahead.t_first_token, ahead.num_output_tokens = 2.5, 100  # 10 s of TBT, 7.5 s gone
    new = book.add("new", R, t_arr=8.0, t_run=8.0)  # 3 s of its TTFT left
    running = [behind, late, ahead, new]
    assert LvfPolicy().passive_victim(running, 10.0) is new
    assert LvfPlusPolicy().passive_victim(running, 10.0) is late
    assert LvfPlusPolicy().passive_victim([behind, ahead, new], 10.0) is behind
    assert LvfPlusPolicy().passive_victim([ahead, new], 10.0) is new


def test_lvf_plus_preempts_passively_a_request_out_of_reach_before_one_behind() -> None:
    """A request behind its TBT pace that can still catch up goes after one that cannot
    meet its SLO any more: its first token came late, or its TBT target is out of reach
    at the last step's duration, even when that one arrived earlier."""
    book = Book()
    lost = book.add("lost", R, t_arr=0.0, t_run=0.0)  # first token 6 s after arrival
    lost.t_first_token, lost.num_output_tokens = 6.0, 40  # on its pace since
    behind = book.add("behind", R, t_arr=3.0, t_run=3.0)
    behind.t_first_token, behind.num_output_tokens = 4.0, 50  # 5 s of TBT, 6 s gone
    behind.max_output_tokens = 200  # 150 more at 0.05 s a step gain 7.5 s
    assert LvfPlusPolicy().passive_victim([lost, behind], 10.0, 0.05) is lost
    # lvf+shed keeps the rule before it: behind its SLO first (the lost one is on pace).
    assert LvfShedPolicy().passive_victim([lost, behind], 10.0, 0.05) is behind
    on_time = book.add("on_time", R, t_arr=1.0, t_run=1.0)
    on_time.t_first_token, on_time.num_output_tokens = 2.0, 10  # 1 s of TBT, 8 s gone
    on_time.max_output_tokens = 20  # 10 more at 0.05 s a step gain 0.5 s: out of reach
    assert LvfPlusPolicy().passive_victim([behind, on_time], 10.0, 0.05) is on_time
    # Without a measured step, a TBT target is never judged out of reach.
    assert LvfPlusPolicy().passive_victim([behind, on_time], 10.0) is behind


def test_lvf_shed_puts_a_request_past_its_ttft_target_after_those_still_in_time() -> None:
    """Room for one: LVF and lvf+ take "late" (VLT 7.5, 5 s past its 5 s target) before
    "fresh" (VLT 1.5, 1 s of its target left); lvf+shed takes "fresh", and "late" once
    nobody still in time is left."""
    book = Book()
    book.add("late", W, 1, t_arr=0.0)
    book.add("fresh", W, 1, t_arr=6.0)
    book.add("more", W, 2, t_arr=6.0)  # too big for the room: the check fails
    state = book.state(now=10.0, free=1, xfer=0)
    assert ids(LvfPlusPolicy().schedule(state).admit) == ["late"]
    assert ids(LvfShedPolicy().schedule(state).admit) == ["fresh"]
    assert ids(LvfShedPolicy().schedule(book.state(now=10.0, free=2, xfer=0)).admit) == [
        "fresh",
        "late",
    ]


def test_lvf_shed_rotates_nobody_out_for_a_request_whose_tbt_is_lost() -> None:
    """ "gone" lags most (rotated out 8.5 s ago, VLT 25.5) but, 9 s after its first of 4
    tokens, misses its 0.1 s mean whatever comes: lvf+ rotates "run" out for it,
    lvf+shed does not. For "fresh", still in time and lagging, it does: "gone" does not
    count as the most lagging candidate, so "run"'s time out is the longer of the
    estimate against "fresh" and the 5 s TTFT target, which its slack covers."""
    book = Book()
    run = book.add("run", R, 1, t_run=0.0)
    run.t_first_token, run.num_output_tokens = 0.0, 10**6
    gone = book.add("gone", S, 1, t_arr=0.0, t_last=1.5)
    gone.t_first_token, gone.num_output_tokens = 1.0, 2
    state = book.state(now=10.0, free=0, xfer=1, step_s=0.05)
    plus = LvfPlusPolicy().schedule(state)
    assert (ids(plus.admit), ids(plus.preempt)) == (["gone"], ["run"])
    assert LvfShedPolicy().schedule(state) == Decision()
    book.add("fresh", W, 1, t_arr=6.0)  # VLT 1.5
    shed = LvfShedPolicy().schedule(book.state(now=10.0, free=0, xfer=1, step_s=0.05))
    assert (ids(shed.admit), ids(shed.preempt)) == (["fresh"], ["run"])


@pytest.mark.parametrize(
    ("tokens", "rotated"),
    [
        (7, False),  # 0.5 s of slack: lvf+'s 0.44 s, not the 5 s TTFT target
        (53, False),  # 5.1 s
        (54, True),  # 5.2 s covers the target, the round trip and a token gap: 5.14 s
    ],
)
def test_lvf_shed_rotates_out_only_requests_that_can_wait_a_ttft_target(
    tokens: int, rotated: bool
) -> None:
    """Fig. 9's second rotation again (see the lvf+ test above): under lvf+shed a
    request rotated out waits for its next token as a new one for its first, so its TBT
    slack must cover its SLO class's TTFT target (5 s) where that is longer than LVF's
    estimate (0.3 s), with the round trip (0.04 s) and a token gap (0.1 s)."""
    state = _fig9_second_rotation(tokens)
    expected = ["C", "D"] if rotated else []
    assert sorted(ids(LvfShedPolicy().schedule(state).preempt)) == expected


def _two_pools(book: Book) -> Room:
    """Model a's pool full, b's with 4 free blocks; a lags most and has run least."""
    book.add("b_run", R, 2, t_run=0.0, model="b")  # the longest run: the tail's first
    book.add("a_run", R, 4, t_run=1.0, model="a")
    book.add("a_w", W, 2, t_arr=0.0, model="a")  # VLT 10 - 0 - 2.5 = 7.5
    book.add("b_w", W, 2, t_arr=1.0, model="b")  # VLT 6.5
    return Room(held={"a": 0, "b": 4})  # both within their floors


def test_lvf_counts_free_blocks_pool_by_pool() -> None:
    """Four blocks free, all in b's pool: the sum holds both candidates, but a's must
    rotate a's own running request out; b's request, the tail's first, frees nothing a
    can use and keeps running."""
    book = Book()
    room = _two_pools(book)
    decision = LvfPolicy().schedule(book.state(now=10.0, free=4, xfer=4, room=room))
    assert (ids(decision.admit), ids(decision.preempt)) == (["a_w", "b_w"], ["a_run"])
    one_sum = LvfPolicy().schedule(book.state(now=10.0, free=4, xfer=4))
    assert (ids(one_sum.admit), ids(one_sum.preempt)) == (["a_w", "b_w"], [])


def test_lvf_rotates_a_model_beyond_its_floor_for_any_pool() -> None:
    """A running request of a model beyond its floor makes room for any pool (its memory
    is given to the model short of it at the step's end); one within its floor only for
    its own."""
    book = Book()
    book.add("c_run", R, 4, t_run=0.0, model="c")
    book.add("b_run", R, 4, t_run=0.5, model="b")
    book.add("a_w", W, 2, t_arr=0.0, model="a")
    within = Room(held={"a": 0, "b": 0})
    decision = LvfPolicy().schedule(book.state(now=10.0, free=0, xfer=4, room=within))
    assert (ids(decision.admit), ids(decision.preempt)) == (["a_w"], [])
    beyond = dataclasses.replace(within, movable=frozenset({"b"}))
    decision = LvfPolicy().schedule(book.state(now=10.0, free=0, xfer=4, room=beyond))
    assert (ids(decision.admit), ids(decision.preempt)) == (["a_w"], ["b_run"])
