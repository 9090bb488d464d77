"""EngineCore end to end with a fake executor and transfer engine.

The fakes assert the contracts on every step (no H2D into a block with a pending
D2H, swapped-in requests join the next batch only); the engine runs its memory
integrity check after every step (``check_integrity=True`` in ``tiny_config``).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

from hypothesis import example, given, settings
from hypothesis import strategies as st

from shunter.engine.config import RotationConfig
from shunter.engine.core import EngineCore, StepStats
from shunter.engine.request import Request, RequestState
from tests.engine.fakes import StepClock, make_core, request, tiny_config

POLICIES = ["fcfs", "wf", "sf", "lvf", "lvf+", "lvf+shed"]


@dataclass
class Run:
    core: EngineCore
    requests: list[Request]
    stats: list[StepStats]


def run(
    core: EngineCore,
    clock: StepClock,
    arrivals: list[tuple[int, Request]],
    *,
    aborts: dict[int, str] | None = None,
    max_steps: int = 1500,
) -> Run:
    """Step until every request arrived and finished and no copy is in flight."""
    pending = sorted(arrivals, key=lambda a: a[0])
    stats: list[StepStats] = []
    step = 0
    while pending or not core.is_idle():
        assert step < max_steps, f"no progress after {max_steps} steps"
        while pending and pending[0][0] <= step:
            r = pending.pop(0)[1]
            r.t_arr = clock.now()
            core.add_request(r)
        if aborts and step in aborts:
            core.abort(aborts[step])
        s = core.step()
        cfg = core.config.scheduler
        assert s.num_batch_tokens <= cfg.max_batch_tokens
        assert s.num_running <= cfg.max_running
        plan = core.executor.plans[-1]  # type: ignore[attr-defined]
        kinds = [e.is_prefill for e in plan.batch if e.num_tokens == 1 and not e.is_prefill]
        assert plan.batch[: len(kinds)] == [e for e in plan.batch if not e.is_prefill]
        stats.append(s)
        step += 1
    return Run(core, [r for _, r in arrivals], stats)


# Up to 32 tokens per request: 8 blocks of 4, what the smallest device holds.
workloads = st.lists(
    st.tuples(
        st.integers(0, 20),  # arrival step
        st.integers(1, 14),  # prompt tokens
        st.integers(1, 18),  # output tokens
    ),
    min_size=1,
    max_size=24,
)


# Interesting cases of the property below, each counted over its examples: requests
# preempted, swapped back in, and KV rotated out ahead of need.
INTERESTING = ("num_preempted", "num_swapped_in", "rotated_blocks")


def test_every_request_finishes_with_its_tokens_and_memory_stays_consistent() -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=200, deadline=None)
    # Four long requests over memory for one: they must preempt, swap back in and
    # rotate eagerly, so the count below never rests on chance.
    @example(
        workload=[(i, 14, 18) for i in range(4)],
        policy="lvf",
        kv_blocks=8,
        host_blocks=10_000,
        xfer=8,
        max_batch_tokens=48,
        max_running=16,
        delay=1,
        eager=True,
        watermark=0.5,
        async_scheduling=True,
        stops=[],
    )
    @given(
        workload=workloads,
        policy=st.sampled_from(POLICIES),
        kv_blocks=st.integers(8, 24),
        host_blocks=st.sampled_from([4, 16, 10_000]),
        xfer=st.integers(0, 16),
        max_batch_tokens=st.integers(4, 48),
        max_running=st.integers(1, 16),
        delay=st.integers(0, 3),
        eager=st.booleans(),
        watermark=st.sampled_from([0.0, 0.5, 0.9]),
        async_scheduling=st.booleans(),
        stops=st.lists(st.tuples(st.integers(0, 23), st.integers(1, 18)), max_size=6),
    )
    def check(
        workload: list[tuple[int, int, int]],
        policy: str,
        kv_blocks: int,
        host_blocks: int,
        xfer: int,
        max_batch_tokens: int,
        max_running: int,
        delay: int,
        eager: bool,
        watermark: float,
        async_scheduling: bool,
        stops: list[tuple[int, int]],
    ) -> None:
        config = tiny_config(
            kv_blocks=kv_blocks,
            host_blocks=host_blocks,
            policy=policy,
            xfer_budget=xfer,
            max_batch_tokens=max_batch_tokens,
            max_running=max_running,
            rotation=RotationConfig(eager=eager, budget_blocks=4, watermark=watermark),
            async_scheduling=async_scheduling,
        )
        core, clock = make_core(config, delay=delay)
        # Some requests stop on a token (as on EOS) before their length.
        core.executor.stop_at = {f"r{i}": n for i, n in stops}  # type: ignore[attr-defined]
        arrivals = [(t, request(f"r{i}", p, o)) for i, (t, p, o) in enumerate(workload)]
        result = run(core, clock, arrivals)
        lengths = [min(o, dict(stops).get(i, o)) for i, (_, _, o) in enumerate(workload)]
        for r, length in zip(result.requests, lengths, strict=True):
            assert r.state is RequestState.FINISHED
            assert r.num_output_tokens == len(r.output_token_ids) == length
            assert r.num_output_placeholders == 0
            assert len(r.token_times) == length
            assert r.token_times == sorted(r.token_times)
            assert r.t_first_token is not None and r.t_first_token > r.t_arr
        assert sum(s.num_emitted for s in result.stats) == sum(lengths)
        seen.update(what for what in INTERESTING if any(getattr(s, what) for s in result.stats))
        assert core.memory.blocks_used() == {"tiny": 0}
        assert core.memory.host.used_bytes == 0
        core.check_integrity()

    check()
    assert all(seen[what] for what in INTERESTING), seen


@settings(max_examples=100, deadline=None)
@given(
    workload=workloads,
    policy=st.sampled_from(POLICIES),
    abort_at=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 23)), max_size=8),
    delay=st.integers(0, 2),
    async_scheduling=st.booleans(),
)
def test_aborts_leak_nothing(
    workload: list[tuple[int, int, int]],
    policy: str,
    abort_at: list[tuple[int, int]],
    delay: int,
    async_scheduling: bool,
) -> None:
    config = tiny_config(
        kv_blocks=10,
        host_blocks=12,
        policy=policy,
        xfer_budget=6,
        rotation=RotationConfig(budget_blocks=2, watermark=0.3),
        async_scheduling=async_scheduling,
    )
    core, clock = make_core(config, delay=delay)
    arrivals = [(t, request(f"r{i}", p, o)) for i, (t, p, o) in enumerate(workload)]
    aborts = {step: f"r{i}" for step, i in abort_at}
    result = run(core, clock, arrivals, aborts=aborts)
    for r in result.requests:
        assert r.state is RequestState.FINISHED
        assert r.aborted or r.num_output_tokens == r.max_output_tokens
    assert core.memory.blocks_used() == {"tiny": 0}
    assert core.memory.host.used_bytes == 0
    assert core.abort("r0") is None


def test_no_transfers_when_memory_never_runs_out() -> None:
    for policy in POLICIES:
        core, clock = make_core(tiny_config(kv_blocks=200, policy=policy))
        arrivals = [(i, request(f"r{i}", 5 + i, 7)) for i in range(12)]
        result = run(core, clock, arrivals)
        assert sum(s.d2h_bytes + s.h2d_bytes for s in result.stats) == 0
        assert sum(s.num_preempted for s in result.stats) == 0


def test_chunked_prefill_under_the_token_budget_decodes_first() -> None:
    core, clock = make_core(tiny_config(kv_blocks=40, max_batch_tokens=16))
    core.add_request(request("short", 3, 6))
    core.step()  # short prefills (3 tokens) and samples its first token
    core.add_request(request("long", 50, 2, t_arr=clock.now()))
    chunks = []
    for _ in range(4):
        core.step()
        plan = core.executor.plans[-1]  # type: ignore[attr-defined]
        assert plan.batch[0].request_id == "short" and not plan.batch[0].is_prefill
        chunks.append([(e.num_tokens, e.samples) for e in plan.batch[1:]])
    assert chunks == [[(15, False)], [(15, False)], [(15, False)], [(5, True)]]


def test_swapped_in_requests_join_the_batch_at_the_next_step() -> None:
    # Four requests, device memory for about two: LVF rotates them (Fig. 9).
    core, clock = make_core(tiny_config(kv_blocks=12, policy="lvf", xfer_budget=4), delay=0)
    arrivals = [(0, request(f"r{i}", 8, 12)) for i in range(4)]
    result = run(core, clock, arrivals)
    plans = core.executor.plans  # type: ignore[attr-defined]
    joined = 0
    for plan, following in itertools.pairwise(plans):
        for rid in plan.swapped_in:
            assert rid not in {e.request_id for e in plan.batch}
            if rid not in following.preempted:
                joined += rid in {e.request_id for e in following.batch}
    assert joined > 0
    assert sum(s.num_swapped_in for s in result.stats) > 0
    assert all(r.num_output_tokens == 12 for r in result.requests)


def test_lvf_serves_waiting_requests_sooner_than_fcfs_under_pressure() -> None:
    """Long-running requests fill memory; LVF rotates them out for the backlog."""
    ttft = {}
    for policy in ("fcfs", "lvf"):
        core, clock = make_core(tiny_config(kv_blocks=24, policy=policy, xfer_budget=8))
        arrivals = [(0, request(f"long{i}", 8, 40)) for i in range(4)]
        arrivals += [(30 + i, request(f"short{i}", 4, 2)) for i in range(6)]
        result = run(core, clock, arrivals)
        shorts = [r for r in result.requests if r.id.startswith("short")]
        ttft[policy] = max(r.ttft or 0.0 for r in shorts)
    assert ttft["lvf"] < ttft["fcfs"]


def test_add_request_rejects_what_can_never_fit() -> None:
    core, _ = make_core(tiny_config(kv_blocks=8))
    core.add_request(request("ok", 20, 12))
    for bad in (request("ok", 1, 1), request("huge", 30, 10), request("x", 1, 1, model="nope")):
        try:
            core.add_request(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad.id} was accepted")


def test_prefix_caching_keeps_every_request_whole_and_memory_consistent() -> None:
    """Prompts built from a few shared heads, under every policy, tight memory, eager
    rotation and swaps: every request finishes, the integrity check (shared blocks'
    holders included) passes after every step, nothing leaks, every token reads the KV
    of its own prefix, and prompts do hit, on the device and in host memory."""
    hits = host_hits = 0

    @settings(max_examples=300, deadline=None)
    # A prompt whose device blocks another filled over after it ended, asked again:
    # its prefix comes back from host memory (the count below never rests on chance).
    @example(
        workload=[(0, 0, 12, 1, 12), (12, 1, 12, 6, 12), (40, 0, 12, 2, 2)],
        policy="lvf",
        kv_blocks=8,
        host_blocks=10_000,
        delay=1,
        eager=True,
        async_scheduling=True,
    )
    @given(
        workload=st.lists(
            st.tuples(
                st.integers(0, 20),  # arrival step
                st.integers(0, 2),  # which shared head
                st.integers(0, 12),  # head tokens used
                st.integers(1, 6),  # own tokens after it
                st.integers(1, 12),  # output tokens
            ),
            min_size=1,
            max_size=20,
        ),
        policy=st.sampled_from(POLICIES),
        kv_blocks=st.integers(8, 20),
        host_blocks=st.sampled_from([4, 10_000]),
        delay=st.integers(0, 2),
        eager=st.booleans(),
        async_scheduling=st.booleans(),
    )
    def check(
        workload: list[tuple[int, int, int, int, int]],
        policy: str,
        kv_blocks: int,
        host_blocks: int,
        delay: int,
        eager: bool,
        async_scheduling: bool,
    ) -> None:
        nonlocal hits, host_hits
        config = tiny_config(
            kv_blocks=kv_blocks,
            host_blocks=host_blocks,
            policy=policy,
            max_batch_tokens=24,
            rotation=RotationConfig(eager=eager, budget_blocks=4, watermark=0.5),
            prefix_caching=True,
            async_scheduling=async_scheduling,
        )
        core, clock = make_core(config, delay=delay)
        heads = [list(range(100 * h, 100 * h + 12)) for h in range(3)]
        arrivals = []
        for i, (t, head, used, own, out) in enumerate(workload):
            r = request(f"r{i}", used + own, out)
            r.prompt_token_ids = heads[head][:used] + [1000 + i] * own
            arrivals.append((t, r))
        result = run(core, clock, arrivals)
        for r in result.requests:
            assert r.state is RequestState.FINISHED
            assert r.num_output_tokens == r.max_output_tokens
        assert core.memory.blocks_used() == {"tiny": 0}
        assert core.memory.host.used_bytes == 0
        core.check_integrity()
        stats = core.memory.prefix_stats
        hits += sum(stats.hits.values())
        host_hits += sum(stats.host_hits.values())

    check()
    assert hits > host_hits > 0
