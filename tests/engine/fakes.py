"""Small stand-ins for the executor, the transfer engine and the clock, plus builders.

They check the contracts EngineCore promises them, so a test fails where the core breaks
one: a swapped-in request in the batch of its own step, an H2D copy into a block whose
D2H copy has not completed, copies out of step order.
"""

from __future__ import annotations

from collections import deque

from shunter.engine.config import EngineConfig, ModelSpec, RotationConfig, SchedulerConfig, SloSpec
from shunter.engine.core import EngineCore
from shunter.engine.interfaces import Clock, Executor, Transfers
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
        ),
        rotation=rotation or RotationConfig(),
        check_integrity=True,
    )


class StepClock(Clock):
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


class FakeExecutor(Executor):
    """Emits token ``step`` for every sampling entry and advances the clock by ``dt``."""

    def __init__(self, clock: StepClock, dt: float = 0.01) -> None:
        self.clock = clock
        self.dt = dt
        self.plans: list[StepPlan] = []
        self._joining: set[str] = set()

    def execute(self, plan: StepPlan) -> StepResult:
        in_batch = {e.request_id for e in plan.batch}
        assert len(in_batch) == len(plan.batch), "a request twice in one batch"
        assert not in_batch & set(plan.swapped_in), "swapped in and in the batch in one step"
        self.plans.append(plan)
        self.clock.t += self.dt
        emitted: dict[str, int | None] = {e.request_id: plan.step for e in plan.batch if e.samples}
        return StepResult(duration_s=self.dt, emitted=emitted)


class FakeTransfers(Transfers):
    """Completes each step's copies ``delay`` polls after submission, in step order.

    Asserts DuplexKV's race rule: no H2D destination is the source of a D2H copy that
    has not completed (this step's or an earlier one's), and no block is copied twice in
    one direction in one step.
    """

    def __init__(self, delay: int = 1) -> None:
        self.delay = delay
        self.queue: deque[tuple[int, int, set[tuple[str, int]]]] = deque()
        self.polls = 0
        self.submitted: list[int] = []

    def pending_d2h(self) -> set[tuple[str, int]]:
        return {src for _, _, srcs in self.queue for src in srcs}

    def submit(self, plan: StepPlan) -> None:
        assert not self.submitted or plan.step > self.submitted[-1]
        self.submitted.append(plan.step)
        d2h = {(m, c.device_block) for m in {*plan.swap_out, *plan.rotate} for c in plan.d2h(m)}
        assert len(d2h) == plan.num_d2h_blocks, "a block copied twice to host in one step"
        h2d = {(m, c.device_block) for m, cs in plan.swap_in.items() for c in cs}
        assert len(h2d) == plan.num_h2d_blocks, "two H2D copies into one block"
        clash = h2d & (d2h | self.pending_d2h())
        assert not clash, f"step {plan.step}: H2D into blocks with pending D2H: {clash}"
        self.queue.append((self.polls + self.delay, plan.step, d2h))

    def poll(self, now: float) -> list[int]:
        self.polls += 1
        done = []
        while self.queue and self.queue[0][0] <= self.polls:
            done.append(self.queue.popleft()[1])
        return done


def make_core(config: EngineConfig, *, delay: int = 1) -> tuple[EngineCore, StepClock]:
    clock = StepClock()
    core = EngineCore(config, FakeExecutor(clock), FakeTransfers(delay), clock)
    return core, clock


def request(rid: str, prompt: int, output: int, t_arr: float = 0.0, model: str = "tiny") -> Request:
    return Request(
        id=rid, model=model, prompt_tokens=prompt, max_output_tokens=output, slo=SLO, t_arr=t_arr
    )
