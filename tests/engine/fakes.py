"""Small stand-ins for the executor, the transfer engine and the clock, plus builders.

They check the contracts EngineCore promises them, so a test fails where the core breaks
one: a swapped-in request in the batch of its own step, an H2D copy into a block whose
D2H copy has not completed, copies out of step order.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from typing import Any

from shunter.engine.config import (
    EngineConfig,
    ModelSpec,
    RemapConfig,
    RotationConfig,
    SchedulerConfig,
    SloSpec,
    TenantSpec,
)
from shunter.engine.core import EngineCore
from shunter.engine.interfaces import Clock, Executor, Transfers
from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.plan import StepPlan, StepResult
from shunter.engine.request import Request

SLO = SloSpec("default", ttft_s=5.0, tbt_s=0.1)

# A tiny model: 2 layers, 2 KV heads of dim 8, 2-byte values -> 128 bytes per token.
TINY = ModelSpec(
    name="tiny",
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    hidden_size=32,
    intermediate_size=64,
    vocab_size=128,
)
BLOCK_TOKENS = 4


def tiny_config(
    *,
    kv_blocks: int,
    host_blocks: int = 10_000,
    policy: str = "lvf",
    xfer_budget: int = 8,
    max_batch_tokens: int = 64,
    max_running: int = 64,
    rotation: RotationConfig | None = None,
    models: tuple[ModelSpec, ...] = (TINY,),
    tenants: tuple[TenantSpec, ...] = (),
    remap: RemapConfig | None = None,
    turn_quantum_s: float = 0.5,
    prefix_caching: bool = False,
    async_scheduling: bool = False,
) -> EngineConfig:
    """An engine whose device arena holds the models' weights plus ``kv_blocks`` blocks of
    the first model (pages are one block each)."""
    block_bytes = models[0].block_bytes(BLOCK_TOKENS)
    weight_pages = sum(
        -(-m.layer_bytes // block_bytes) * m.num_layers
        + -(-(m.embedding_params * m.dtype_bytes) // block_bytes)
        for m in models
    )
    return EngineConfig(
        models=models,
        device_bytes=(weight_pages + kv_blocks) * block_bytes,
        host_swap_bytes=host_blocks * block_bytes,
        page_bytes=block_bytes,
        block_tokens=BLOCK_TOKENS,
        scheduler=SchedulerConfig(
            policy=policy,
            xfer_budget_blocks=xfer_budget,
            max_batch_tokens=max_batch_tokens,
            max_running=max_running,
            turn_quantum_s=turn_quantum_s,
        ),
        rotation=rotation or RotationConfig(),
        tenants=tenants,
        remap=remap or RemapConfig(),
        check_integrity=True,
        prefix_caching=prefix_caching,
        async_scheduling=async_scheduling,
    )


class StepClock(Clock):
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


# Whose KV a slot holds: (request id, token position), or for a request with token ids
# the tokens up to and including that position (the KV of equal prefixes is equal, so
# prefix caching may serve one request's slots to another).
Tag = tuple[str, int] | tuple[int, ...]


class Contents:
    """What every device and host block holds, token slot by token slot.

    The fake executor writes a tag per computed token and checks, before each step,
    that every token a batch entry attends to is where its block table says; the fake
    transfers copy tags. A block overwritten while a copy still reads it, a stale host
    copy, or a wrong block table then shows up as a wrong tag.
    """

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.device: dict[tuple[str, int], list[Tag | None]] = {}
        self.host: dict[tuple[str, int], list[Tag | None]] = {}

    def empty(self) -> list[Tag | None]:
        return [None] * self.block_tokens


class FakeExecutor(Executor):
    """Emits token ``step`` for every sampling entry and advances the clock by ``dt``.

    Like a real executor it waits for the H2D copies of a swapped-in request before
    computing it: here, by completing that step's transfers. With ``contents`` and
    ``memory`` set it also plays the device: it performs the plan's moves, checks the KV
    each entry reads, and writes the KV it computes.
    """

    def __init__(self, clock: StepClock, transfers: FakeTransfers, dt: float = 0.01) -> None:
        self.clock = clock
        self.transfers = transfers
        self.dt = dt
        self.plans: list[StepPlan] = []
        self.contents: Contents | None = None
        self.memory: KVMemory | None = None
        self.requests: Mapping[str, Request] = {}
        # A request stops (as on EOS) with its ``stop_at[id]``-th token.
        self.stop_at: dict[str, int] = {}
        self._swapped_in: dict[str, int] = {}
        self._num_sampled: Counter[str] = Counter()

    def forward(self, plan: StepPlan) -> object:
        """Nothing: with async scheduling the whole step plays in ``sample``, on the
        engine's thread, after the next plan is made (the latest a forward pass ends),
        so a plan that acts too early shows as a wrong tag, deterministically."""
        return plan

    def sample(self, plan: StepPlan, forwarded: object) -> StepResult:
        return self.execute(plan)

    def execute(self, plan: StepPlan) -> StepResult:
        in_batch = {e.request_id for e in plan.batch}
        assert len(in_batch) == len(plan.batch), "a request twice in one batch"
        assert not in_batch & set(plan.copied_in), "copied in and in the batch in one step"
        for rid in in_batch & self._swapped_in.keys():
            self.transfers.complete_through(self._swapped_in.pop(rid))
        self._swapped_in.update((rid, plan.step) for rid in plan.copied_in)
        for rid in plan.released:
            self._swapped_in.pop(rid, None)
        if self.contents is not None and self.memory is not None:
            self._play(plan, self.contents, self.memory, self.requests)
        self.plans.append(plan)
        self.clock.t += self.dt
        emitted: dict[str, int | None] = {e.request_id: plan.step for e in plan.batch if e.samples}
        self._num_sampled.update(emitted.keys())
        stopped = {rid for rid in emitted if self._num_sampled[rid] == self.stop_at.get(rid)}
        return StepResult(duration_s=self.dt, emitted=emitted, stopped=stopped)

    @staticmethod
    def _play(
        plan: StepPlan, contents: Contents, memory: KVMemory, requests: Mapping[str, Request]
    ) -> None:
        bt = contents.block_tokens

        def tag(rid: str, pos: int) -> Tag:
            r = requests.get(rid)
            if r is None or r.prompt_token_ids is None:
                return (rid, pos)
            return tuple(r.token_ids(0, pos + 1))

        for model, moves in plan.moves.items():
            for move in moves:
                held = contents.device.get((model, move.src), contents.empty())
                contents.device[model, move.dst] = list(held)
        for e in plan.batch:  # the tokens the plan gives are the request's own
            tokens = plan.token_ids.get(e.request_id)
            if tokens is not None:
                start = e.num_computed_tokens
                own = requests[e.request_id].token_ids(start, start + e.num_tokens)
                assert tokens == own, f"step {plan.step}: {e.request_id} gets {tokens}"
        # As a forward pass does layer by layer: every entry's KV is written, then read.
        for e in plan.batch:
            table = plan.block_tables[e.request_id]
            for pos in range(e.num_computed_tokens, e.num_computed_tokens + e.num_tokens):
                block = contents.device.setdefault((e.model, table[pos // bt]), contents.empty())
                block[pos % bt] = tag(e.request_id, pos)
        for e in plan.batch:
            table = plan.block_tables[e.request_id]
            for pos in range(e.num_computed_tokens):
                held = contents.device.get((e.model, table[pos // bt]), contents.empty())
                assert held[pos % bt] == tag(e.request_id, pos), (
                    f"step {plan.step}: {e.request_id} token {pos} reads {held[pos % bt]}"
                )


class FakeTransfers(Transfers):
    """Completes each step's copies ``delay`` polls after submission, in step order.

    Asserts DuplexKV's race rules: no H2D copy into a block that a copy still in flight
    reads or writes (this step's or an earlier one's), no D2H copy out of a block an H2D
    copy still writes, no block copied twice in one step. With ``contents`` set it moves
    tags: H2D copies happen at submission (the earliest moment), D2H copies at completion
    (the latest), so a block reused too early is caught.
    """

    def __init__(self, delay: int = 1) -> None:
        self.delay = delay
        self.queue: deque[tuple[int, int, list[tuple[str, int, int]], set[tuple[str, int]]]] = (
            deque()
        )
        self.polls = 0
        self.submitted: list[int] = []
        self.done: list[int] = []
        self.contents: Contents | None = None

    def submit(self, plan: StepPlan) -> None:
        assert not self.submitted or plan.step > self.submitted[-1]
        self.submitted.append(plan.step)
        d2h = [(m, d, h) for m in {*plan.swap_out, *plan.rotate} for d, h in plan.d2h(m).pairs()]
        sources = self._sources(d2h)
        # A block shared by prefix caching may be copied out once per holder; a host
        # block is written at most once.
        targets = {(m, h) for m, _, h in d2h}
        assert len(targets) == len(d2h), "a host block written twice in one step"
        dests = {(m, d) for m, cs in plan.swap_in.items() for d in cs.devices}
        assert len(dests) == plan.num_h2d_blocks, "two H2D copies into one block"
        reading = sources | {b for _, _, d2h, _ in self.queue for b in self._sources(d2h)}
        writing = {b for _, _, _, dsts in self.queue for b in dsts}
        clash = dests & (reading | writing)
        assert not clash, f"step {plan.step}: H2D into blocks still copied: {clash}"
        clash = sources & (writing | dests)
        assert not clash, f"step {plan.step}: D2H out of blocks still written: {clash}"
        if self.contents is not None:
            for m, cs in plan.swap_in.items():
                for d, h in cs.pairs():
                    held = self.contents.host[m, h]
                    self.contents.device[m, d] = list(held)
        self.queue.append((self.polls + self.delay, plan.step, d2h, dests))

    @staticmethod
    def _sources(d2h: list[tuple[str, int, int]]) -> set[tuple[str, int]]:
        return {(m, d) for m, d, _ in d2h}

    def poll(self, now: float) -> list[int]:
        self.polls += 1
        while self.queue and self.queue[0][0] <= self.polls:
            self._land()
        done, self.done = self.done, []
        return done

    def complete_through(self, step: int) -> None:
        """Finish every copy of steps up to ``step`` now (an executor waits on them)."""
        while self.queue and self.queue[0][1] <= step:
            self._land()

    def _land(self) -> None:
        _, step, d2h, _ = self.queue.popleft()
        if self.contents is not None:
            for m, d, h in d2h:
                held = self.contents.device.get((m, d), self.contents.empty())
                self.contents.host[m, h] = list(held)
        self.done.append(step)


def make_core(config: EngineConfig, *, delay: int = 1) -> tuple[EngineCore, StepClock]:
    """An EngineCore over the fakes, with block contents tracked and checked."""
    clock = StepClock()
    transfers = FakeTransfers(delay)
    executor = FakeExecutor(clock, transfers)
    core = _TrackedCore(config, executor, transfers, clock)
    executor.contents = transfers.contents = Contents(config.block_tokens)
    executor.memory = core.memory
    executor.requests = core.added
    return core, clock


class _TrackedCore(EngineCore):
    """An EngineCore that keeps every request it was given (``added``), so the fake
    executor tags tokens even of a request a plan in flight retired."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.added: dict[str, Request] = {}

    def add_request(self, request: Request) -> None:
        super().add_request(request)
        self.added[request.id] = request


def request(rid: str, prompt: int, output: int, t_arr: float = 0.0, model: str = "tiny") -> Request:
    return Request(
        id=rid, model=model, prompt_tokens=prompt, max_output_tokens=output, slo=SLO, t_arr=t_arr
    )
