"""Hand-built policy states: requests with given timestamps and block counts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

from shunter.engine.config import SloSpec
from shunter.engine.core import EngineCore
from shunter.engine.plan import StepPlan, StepResult
from shunter.engine.request import Request, RequestState
from shunter.engine.sched.policy import PolicyInput
from shunter.engine.sched.room import Room
from tests.engine.fakes import FakeExecutor, make_core, request, tiny_config

SLO = SloSpec("paper", ttft_s=5.0, tbt_s=0.1, alpha=3.0, beta_b=0.0, beta_f=0.5)

# A device whose step costs a fixed overhead plus a cost per batched token.
OVERHEAD_S, PER_TOKEN_S = 0.004, 1e-4


def linear_step_s(num_tokens: int) -> float:
    return OVERHEAD_S + PER_TOKEN_S * num_tokens


def timed_linearly(core: EngineCore) -> None:
    """Make the core's fake executor take ``linear_step_s(tokens)`` per step."""
    executor = core.executor
    assert isinstance(executor, FakeExecutor)
    execute = executor.execute

    def run(plan: StepPlan) -> StepResult:
        executor.dt = linear_step_s(plan.num_batch_tokens)
        return execute(plan)

    executor.execute = run  # type: ignore[method-assign]


# A TTFT target of two fake steps: with beta_F = 0.5, a waiting request lags after one.
ONE_STEP_TTFT = SloSpec("tight", ttft_s=0.02, tbt_s=0.1)


class CappedRun(NamedTuple):
    requests: list[Request]
    num_steps: int
    num_preempted: int


def run_capped(slo: SloSpec, policy: str = "lvf") -> CappedRun:
    """Six short requests, two running slots, memory for all of them, run to the end: the
    requests, the steps taken and the preemptions. docs/engine.md states its counts."""
    core, _ = make_core(tiny_config(kv_blocks=40, max_running=2, policy=policy))
    requests = [
        dataclasses.replace(request(f"r{i}", 40, 8, t_arr=0.001 * i), slo=slo) for i in range(6)
    ]
    for r in requests:
        core.add_request(r)
    num_steps = num_preempted = 0
    while not core.is_idle():
        stats = core.step()
        assert stats.num_running <= 2
        assert stats.num_preempted <= stats.num_admitted + stats.num_swapped_in
        num_steps += 1
        num_preempted += stats.num_preempted
    assert all(r.num_output_tokens == 8 for r in requests)
    return CappedRun(requests, num_steps, num_preempted)


class Book:
    """Requests by name with their block counts, and a PolicyInput over them."""

    def __init__(self) -> None:
        self.blocks: dict[str, int] = {}
        self.requests: dict[str, Request] = {}
        self.pinned: set[str] = set()  # running requests the host cannot take

    def add(
        self,
        name: str,
        state: RequestState,
        blocks: int = 1,
        *,
        t_arr: float = 0.0,
        t_run: float | None = None,
        t_last: float | None = None,
        slo: SloSpec = SLO,
        model: str = "m",
    ) -> Request:
        r = Request(
            id=name, model=model, prompt_tokens=4, max_output_tokens=4, slo=slo, t_arr=t_arr
        )
        r.state, r.t_run, r.t_last = state, t_run, t_last
        self.blocks[name] = blocks
        self.requests[name] = r
        return r

    def blk(self, r: Request) -> int:
        return self.blocks[r.id]

    def of(self, state: RequestState) -> list[Request]:
        return [r for r in self.requests.values() if r.state is state]

    def state(
        self,
        now: float,
        free: int,
        xfer: int,
        slots: int | None = None,
        swap_s: Callable[[Request], float] | None = None,
        step_s: float | None = None,
        room: Room | None = None,
    ) -> PolicyInput:
        """The PolicyInput at ``now``; without ``slots`` the running cap leaves a slot
        for every request; ``room``: free blocks pool by pool (None: ``free`` in one)."""
        return PolicyInput(
            model="m",
            now=now,
            running=self.of(RequestState.RUNNING),
            waiting=self.of(RequestState.WAITING),
            rotary=self.of(RequestState.ROTARY),
            num_free_blocks=free,
            num_free_slots=len(self.requests) if slots is None else slots,
            xfer_budget=xfer,
            blk=self.blk,
            blks=lambda requests: [self.blocks[r.id] for r in requests],
            can_rotate=lambda r: r.id not in self.pinned,
            swap_s=swap_s,
            step_s=step_s,
            room=room,
        )


def ids(requests: Sequence[Request]) -> list[str]:
    return [r.id for r in requests]
