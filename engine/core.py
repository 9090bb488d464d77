"""EngineCore: the step loop over the Clock, Executor and Transfers interfaces.

Pure logic: no torch. The torch executor and the simulator drive the same core.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from shunter.engine.config import EngineConfig, ModelSpec, TenantSpec
from shunter.engine.interfaces import Clock, Executor, Transfers
from shunter.engine.liveness import ProgressWatch
from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.plan import BlockCopies, StepPlan, StepResult
from shunter.engine.remap.remapper import Remapper
from shunter.engine.remap.timing import LayerTiming
from shunter.engine.request import PLACEHOLDER, Request, RequestState
from shunter.engine.sched.policies import make_policy
from shunter.engine.sched.scheduler import Scheduler


@dataclass
class StepStats:
    """What one step did, for metrics: counts, blocks and bytes moved, and the
    requests that finished (their timestamps carry TTFT and every token gap).

    ``t_start`` is the clock when the step began and ``t_end`` when its tokens were
    emitted; ``duration_s`` is the executor's figure for the step. ``schedule_s`` is
    the host time (wall clock, even in the simulator) spent planning the step.
    ``executing`` lists the models in the batch and ``turn`` the temporal model holding
    the turn after the step; ``remapped_layers`` the layers each model has lent to the
    KV cache after the step's remapping, ``layers_restored`` the layers the step loaded
    back. ``tokens_by_model`` counts the tokens each model computed (vLLM's iteration
    tokens).
    """

    step: int
    t_start: float
    t_end: float
    duration_s: float
    schedule_s: float
    num_batch_tokens: int
    num_decodes: int
    num_prefills: int
    num_emitted: int
    num_preempted: int
    num_swapped_in: int
    num_admitted: int
    d2h_blocks: int
    h2d_blocks: int
    rotated_blocks: int
    moved_blocks: int
    d2h_bytes: int
    h2d_bytes: int
    num_waiting: int
    num_running: int
    num_rotary: int
    device_kv_blocks_used: dict[str, int]
    host_bytes_used: int
    executing: list[str] = field(default_factory=list)
    turn: str | None = None
    remapped_layers: dict[str, int] = field(default_factory=dict)
    layers_restored: int = 0
    finished: list[Request] = field(default_factory=list)
    tokens_by_model: dict[str, int] = field(default_factory=dict)
    compute_s: float = 0.0  # the models' forward passes, where the executor measures them


@dataclass(frozen=True)
class NewModel:
    """A model to serve while running: its spec and tenancy, the KV tokens it must have
    room for (a full context), and its layer timing (with remapping on)."""

    spec: ModelSpec
    tenant: TenantSpec
    num_tokens: int
    timing: LayerTiming | None = None


@dataclass(frozen=True)
class _Launched:
    """A step whose plan is made and whose forward pass runs (async scheduling)."""

    plan: StepPlan
    t_start: float
    schedule_s: float
    forwarded: Future[object]


class EngineCore:
    """Serves the requests of every model in ``config`` one step at a time.

    ``step()``: poll completed transfers (frees fenced blocks, lands host copies),
    schedule (policy, memory verbs, batch), submit the plan's copies, execute the
    batch, then emit tokens, update TTFT/TBT timestamps and finish requests.
    With ``config.check_integrity`` (debug mode) the memory integrity check and the
    liveness invariant (``liveness``: live requests emit a token within a bounded time)
    run after every step; a driver may give its own ``progress`` watch (the simulator's
    bounds steps too), which then runs whatever the mode.

    With ``config.remap.enabled`` the models' weights are lent to the KV cache under
    pressure (Oneiros); ``timings`` then gives each model's T_T and prior forward
    times, and the executor's ``StepResult.compute_s`` keeps the latter measured.

    With ``config.async_scheduling`` steps overlap (DuplexKV's cross-iteration pipeline,
    SuperInfer §4.3.2): while the executor's forward pass of step t runs on a worker
    thread, ``step()`` plans step t+1, then samples step t (``Executor.sample``), puts
    its tokens in place of step t+1's placeholders, submits step t+1's copies and
    starts its forward pass, and only then updates requests with step t's tokens and
    returns step t's figures: the caller hands out outputs while step t+1 runs. A plan
    is planned before the previous step's tokens are known: it counts them as
    placeholders, and holds the requests that step stopped (their entries are wasted).
    Every physical effect of a plan (copies, moves, forward pass) still happens after
    the previous forward pass ends, so memory freed by planning is never written early.
    """

    def __init__(
        self,
        config: EngineConfig,
        executor: Executor,
        transfers: Transfers,
        clock: Clock,
        *,
        timings: Mapping[str, LayerTiming] | None = None,
        progress: ProgressWatch | None = None,
    ) -> None:
        self.config = config
        self.executor = executor
        self.transfers = transfers
        self.clock = clock
        self.memory = KVMemory(config)
        self.remapper: Remapper | None = None
        if config.remap.enabled:
            if timings is None:
                raise ValueError("remapping needs each model's timings")
            self.remapper = Remapper(config, self.memory, timings)
        policy = make_policy(config.scheduler.policy)
        self.scheduler = Scheduler(config, self.memory, policy, self.remapper)
        self._block_bytes = {spec.name: config.block_bytes(spec.name) for spec in config.models}
        self._step = 0
        # False from the step that finished the last live request until a step changes
        # no remapping: the engine steps on (idle) while lent layers come back.
        self._remap_settled = True
        if progress is None and config.check_integrity:
            progress = ProgressWatch(limit_steps=None)  # a wall clock: no bound in steps
        self.progress = progress
        self._launched: _Launched | None = None
        self._worker: ThreadPoolExecutor | None = None

    def change_models(
        self,
        removing: Sequence[str],
        adding: Sequence[NewModel],
    ) -> None:
        """Stop serving the models ``removing`` and start serving ``adding``, between
        two steps; every other model's requests stay as they are.

        Raises NoRoom (a ValueError with the bytes needed, free and reclaimable),
        changing nothing, when the added models' weights and a full context of each
        (``NewModel.num_tokens``) would not fit the arena with the removed models gone,
        the KV floors would add up to more than the pages the weights leave, or a live
        request of another model would no longer fit; ValueError, changing
        nothing, while a removed model still has live requests or copies in flight.
        """
        if self._launched is not None:  # the executor's models and pages stay put
            self._launched.forwarded.result()
        for model in removing:
            if self.scheduler.queues[model] or not self.memory.can_remove_model(model):
                raise ValueError(f"model {model!r} still has live requests or copies in flight")
        others = [r for r in self.scheduler.requests.values() if r.model not in removing]
        floors = {m.spec.name: m.tenant.kv_floor for m in adding}
        self.memory.check_room([(m.spec, m.num_tokens) for m in adding], removing, others, floors)
        for model in removing:
            self.scheduler.remove_model(model)
        for m in adding:
            self.scheduler.add_model(m.spec, m.tenant, m.timing)
        gone = set(removing)
        self.config = dataclasses.replace(
            self.config,
            models=tuple(s for s in self.config.models if s.name not in gone)
            + tuple(m.spec for m in adding),
            tenants=tuple(self.scheduler.tenancy.tenants.values()),
        )
        self._block_bytes = {s.name: self.config.block_bytes(s.name) for s in self.config.models}

    def add_request(self, request: Request) -> None:
        """Queue a WAITING request; ``request.t_arr`` is its arrival on this clock."""
        if self.progress is not None and not self.scheduler.requests:
            self.progress.rest(self.clock.now())
        self.scheduler.add_request(request)

    def abort(self, request_id: str) -> Request | None:
        """End a live request now, freeing all its blocks; None if it is not live."""
        aborted = self.scheduler.abort(request_id, self.clock.now())
        if aborted is not None and not self.scheduler.requests:
            self._remap_settled = False
        return aborted

    @property
    def step_in_flight(self) -> bool:
        """A step's forward pass runs (async scheduling) and ``step()`` completes it."""
        return self._launched is not None

    @property
    def num_live(self) -> int:
        return len(self.scheduler.requests)

    def is_idle(self) -> bool:
        """No live request, no copy in flight, and no lent layer still coming back: once
        the last request finishes, steps go on (empty) for as long as remapping moves, so
        layers are restored while the engine has nothing else to do, not at the next
        request's expense."""
        if self.step_in_flight or self.scheduler.requests or self.memory.num_pending_steps:
            return False
        if self._remap_settled or self.remapper is None:
            return True
        return not any(self.remapper.alpha().values())

    def check_integrity(self) -> None:
        self.memory.check_integrity(self.scheduler.requests.values())

    def close(self) -> None:
        """Wait for a forward pass in flight and stop the worker thread (async
        scheduling); the step it belongs to is not completed."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        self._launched = None

    def step(self) -> StepStats:
        """Run one step and return its figures; with async scheduling, complete the
        step in flight (launching one first if none is) and leave the next in flight
        while requests are live."""
        if not self.config.async_scheduling:
            plan, t_start, schedule_s = self._plan()
            self.transfers.submit(plan)
            result = self.executor.execute(plan)
            return self._complete(plan, result, t_start, schedule_s)
        launched = self._launched or self._launch(*self._plan())
        self._launched = None  # a failed step leaves nothing in flight behind it
        ahead = self._plan() if self.scheduler.requests else None
        result = self.executor.sample(launched.plan, launched.forwarded.result())
        if ahead is not None:
            _fill_placeholders(ahead[0], result)
            self._launch(*ahead)
        return self._complete(launched.plan, result, launched.t_start, launched.schedule_s)

    def _plan(self) -> tuple[StepPlan, float, float]:
        """The next step's plan, the clock when planning began and the host time it took."""
        t_start = self.clock.now()
        self.memory.complete(self.transfers.poll(t_start))
        t0 = time.perf_counter()
        plan = self.scheduler.schedule(t_start, self._step)
        schedule_s = time.perf_counter() - t0
        self._step += 1
        return plan, t_start, schedule_s

    def _launch(self, plan: StepPlan, t_start: float, schedule_s: float) -> _Launched:
        """Submit the plan's copies and start its forward pass on the worker thread, with
        block tables of its own (the next plan changes the requests' tables while it
        runs)."""
        plan.block_tables = {rid: list(table) for rid, table in plan.block_tables.items()}
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="shunter-forward")
        self.transfers.submit(plan)
        forwarded = self._worker.submit(self.executor.forward, plan)
        self._launched = _Launched(plan, t_start, schedule_s, forwarded)
        return self._launched

    def _complete(
        self, plan: StepPlan, result: StepResult, t_start: float, schedule_s: float
    ) -> StepStats:
        """Apply an executed plan's result and return the step's figures."""
        t_end = self.clock.now()
        if self.remapper is not None:
            self.remapper.observe(plan, result)
        finished = self.scheduler.update(plan, result, t_end)
        if finished and not self.scheduler.requests:
            self._remap_settled = False
        elif not self.scheduler.requests:
            moving = plan.restored or plan.remapped
            self._remap_settled = not moving and not (
                self.remapper is not None and self.remapper.is_vacating
            )
        if self.config.check_integrity:
            self.check_integrity()
        if self.progress is not None:
            self.progress.observe(
                now=t_end,
                step=plan.step,
                num_emitted=self.scheduler.num_recorded,
                num_live=self.num_live,
            )
        return self._stats(plan, result, t_start, t_end, schedule_s, finished)

    def _stats(
        self,
        plan: StepPlan,
        result: StepResult,
        t_start: float,
        t_end: float,
        schedule_s: float,
        finished: list[Request],
    ) -> StepStats:
        def nbytes(copies: dict[str, BlockCopies]) -> int:
            return sum(len(c) * self._block_bytes[m] for m, c in copies.items())

        num_prefills = sum(1 for e in plan.batch if e.is_prefill)
        return StepStats(
            step=plan.step,
            t_start=t_start,
            t_end=t_end,
            duration_s=result.duration_s,
            schedule_s=schedule_s,
            num_batch_tokens=plan.num_batch_tokens,
            num_decodes=len(plan.batch) - num_prefills,
            num_prefills=num_prefills,
            num_emitted=self.scheduler.num_recorded,
            num_preempted=len(plan.preempted),
            num_swapped_in=len(plan.swapped_in),
            num_admitted=len(plan.admitted),
            d2h_blocks=plan.num_d2h_blocks,
            h2d_blocks=plan.num_h2d_blocks,
            rotated_blocks=sum(map(len, plan.rotate.values())),
            moved_blocks=sum(map(len, plan.moves.values())),
            d2h_bytes=nbytes(plan.swap_out) + nbytes(plan.rotate),
            h2d_bytes=nbytes(plan.swap_in),
            num_waiting=self.scheduler.count(RequestState.WAITING),
            num_running=self.scheduler.count(RequestState.RUNNING),
            num_rotary=self.scheduler.count(RequestState.ROTARY),
            device_kv_blocks_used=self.memory.blocks_used(),
            host_bytes_used=self.memory.host.used_bytes,
            executing=list(dict.fromkeys(e.model for e in plan.batch)),
            turn=self.scheduler.tenancy.holder,
            remapped_layers={} if self.remapper is None else self.remapper.alpha(),
            layers_restored=sum(map(len, plan.restored.values())),
            finished=finished,
            tokens_by_model=_tokens_by_model(plan),
            compute_s=sum(result.compute_s.values()),
        )


def _fill_placeholders(plan: StepPlan, result: StepResult) -> None:
    """Put the tokens ``result`` sampled in place of ``plan``'s placeholders: a
    request's only unknown token is its newest, so it can only end an entry."""
    for request_id, tokens in plan.token_ids.items():
        if tokens and tokens[-1] == PLACEHOLDER:
            token = result.emitted.get(request_id)
            if token is None:
                raise RuntimeError(
                    f"step {plan.step}: no token sampled for {request_id!r}'s placeholder"
                )
            tokens[-1] = token


def _tokens_by_model(plan: StepPlan) -> dict[str, int]:
    """The tokens each model computed in ``plan``'s batch."""
    tokens: dict[str, int] = {}
    for entry in plan.batch:
        tokens[entry.model] = tokens.get(entry.model, 0) + entry.num_tokens
    return tokens
