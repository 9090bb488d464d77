"""The Scheduler: live requests in, one StepPlan per step out, results applied back.

It composes the policy (who), KVMemory (where) and the per-model queues, and owns the
parts every policy shares: decode first with passive preemption, chunked prefill
under a token budget, the cross-iteration pipeline, and eager rotation.
"""

from __future__ import annotations

from shunter.engine.config import EngineConfig
from shunter.engine.memory.manager import KVMemory
from shunter.engine.plan import BatchEntry, StepPlan, StepResult
from shunter.engine.request import Request, RequestState
from shunter.engine.sched.policy import Decision, Policy, PolicyInput
from shunter.engine.sched.queues import RequestQueues

RUNNING, ROTARY, WAITING = RequestState.RUNNING, RequestState.ROTARY, RequestState.WAITING

# tuple.__new__ builds a BatchEntry in C at half the cost of its Python __new__: a step
# makes one per running request.
_entry = tuple.__new__


class Scheduler:
    """Plans steps for every model of one engine.

    Step order (``schedule``):
      1. Decode first: each running request in decode gets a block for its next token;
         when none is free it waits for blocks already being released, or else the
         latest arrival is preempted (passive preemption).
      2. For each model, the policy's decision: preemptions are applied now.
      3. Batch: decodes, then prefill chunks of running requests, within
         ``max_batch_tokens``.
      4. Admissions in the decision's order, stopping at the first that does not fit:
         waiting requests get blocks and a first prefill chunk; rotary requests are
         swapped in (their H2D overlaps this step's forward pass).
      5. Eager rotation of SYNCED blocks.
    ``update`` applies the executor's result: KV progress, tokens, finished requests.

    A swapped-in request joins the batch at the first step that finds its own H2D
    copies complete: the next one when they take less than a step. Until then it holds
    its blocks and sits out, so no step waits on another request's copies; its
    ``t_run`` is the current step until it joins, so it runs before it can rotate
    again. Swap copies still in flight count against B_xfer, so rotation never plans
    more than the link moves.
    """

    def __init__(self, config: EngineConfig, memory: KVMemory, policy: Policy) -> None:
        self.config = config.scheduler
        self.memory = memory
        self.policy = policy
        self.queues = {spec.name: RequestQueues() for spec in config.models}
        self.requests: dict[str, Request] = {}
        self._released: list[str] = []
        self._joining: list[Request] = []

    # -- requests --------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.model not in self.queues:
            raise ValueError(f"request {request.id!r}: unknown model {request.model!r}")
        if request.id in self.requests:
            raise ValueError(f"request {request.id!r} already exists")
        if request.state is not WAITING or request.num_computed_tokens:
            raise ValueError(f"request {request.id!r} must arrive WAITING with no KV")
        need = self.memory.num_blocks(request.prompt_tokens + request.max_output_tokens)
        if need > self.memory.num_total_blocks(request.model):
            raise ValueError(
                f"request {request.id!r} needs {need} KV blocks; model {request.model!r} "
                f"has {self.memory.num_total_blocks(request.model)}"
            )
        self.requests[request.id] = request
        self.queues[request.model].waiting[request.id] = request

    def abort(self, request_id: str, now: float) -> Request | None:
        """End a live request and free everything it holds; None if it is not live."""
        request = self.requests.get(request_id)
        if request is None:
            return None
        request.aborted = True
        self._finish(request, now)
        return request

    @property
    def num_running(self) -> int:
        return sum(len(q.running) for q in self.queues.values())

    def count(self, state: RequestState) -> int:
        return sum(q.count(state) for q in self.queues.values())

    # -- one step --------------------------------------------------------------------------
    def schedule(self, now: float, step: int) -> StepPlan:
        plan = StepPlan(step=step, released=self._released)
        self._released = []
        # Swapped-in requests start running when they join the batch; their VLT is 0 at
        # this step's decision, so they run before they can rotate.
        self._joining = [r for r in self._joining if r.state is RUNNING]
        for r in self._joining:
            r.t_run = now
        self._joining = [r for r in self._joining if not self.memory.is_resident(r)]
        sitting_out = {r.id for r in self._joining}
        self.memory.begin_step(plan)
        for q in self.queues.values():
            q.land(self.memory.has_landed)
        decodes: list[Request] = []
        prefills: list[Request] = []
        for model, q in self.queues.items():
            reserved, prefilling = self._reserve_decodes(model, q, plan, sitting_out)
            decodes += reserved
            prefills += prefilling
        decisions = {model: self._decide(model, q, plan, now) for model, q in self.queues.items()}

        # The policy may have preempted some of them since.
        tokens = self.config.max_batch_tokens
        for r in decodes:
            if tokens <= 0:
                break
            if r.state is RUNNING:
                plan.batch.append(
                    _entry(BatchEntry, (r.id, r.model, 1, r.num_computed_tokens, False, True))
                )
                tokens -= 1
        for r in prefills:
            if tokens <= 0:
                break
            if r.state is RUNNING:
                tokens -= self._add_chunk(plan, r, tokens)

        num_running = self.num_running
        for model, decision in decisions.items():
            q = self.queues[model]
            for r in decision.admit:
                if num_running >= self.config.max_running:
                    break
                used = self._admit(r, q, plan, now, tokens)
                if used is None:
                    break
                num_running += 1
                tokens -= used
        self.memory.rotate()
        self.memory.end_step()
        return plan

    def update(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        """Apply the executor's result at time ``now``; return the requests that finished."""
        finished = []
        for entry in plan.batch:
            r = self.requests[entry.request_id]
            r.num_computed_tokens += entry.num_tokens
            self.memory.mark_computed(r)
            if not entry.samples:
                continue
            if r.id not in result.emitted:
                raise RuntimeError(f"step {plan.step}: no token for request {r.id!r}")
            r.record_token(now, result.emitted[r.id])
            if r.num_output_tokens >= r.max_output_tokens or r.id in result.stopped:
                self._finish(r, now)
                finished.append(r)
        return finished

    # -- parts ---------------------------------------------------------------------------
    def _reserve_decodes(
        self, model: str, q: RequestQueues, plan: StepPlan, sitting_out: set[str]
    ) -> tuple[list[Request], list[Request]]:
        """Blocks for the next token of each decoding request, oldest first.

        Returns the decoding requests that got a block and the running requests still
        in prefill, in running order, leaving out those whose swap-in copies are in
        flight (``sitting_out``). Out of blocks, a request waits for blocks already on
        their way (released by a preemption whose copies are in flight); if none are,
        the latest arrival is preempted (vLLM's passive preemption), possibly the
        request itself.
        """
        decodes: list[Request] = []
        prefills: list[Request] = []
        memory = self.memory
        incoming = memory.num_incoming_blocks(model)
        for r in list(q.running.values()):
            if r.state is not RUNNING or r.id in sitting_out:
                continue
            if r.is_prefill:
                prefills.append(r)
                continue
            while not memory.can_append(r, 1):
                if incoming > 0:
                    incoming -= 1
                    break
                victim = max(q.running.values(), key=lambda v: v.t_arr)
                self._preempt(victim, q, plan)
                incoming = memory.num_incoming_blocks(model)
                if victim is r:
                    break
            else:
                memory.append(r, 1)
                decodes.append(r)
        return decodes, prefills

    def _decide(self, model: str, q: RequestQueues, plan: StepPlan, now: float) -> Decision:
        moved = self.memory.num_swap_blocks_in_flight
        state = PolicyInput(
            model=model,
            now=now,
            running=list(q.running.values()),
            waiting=list(q.waiting.values()),
            rotary=list(q.rotary.values()),
            num_free_blocks=self.memory.num_free_blocks(model),
            num_free_slots=max(0, self.config.max_running - self.num_running),
            xfer_budget=max(0, self.config.xfer_budget_blocks - moved),
            blk=self.memory.blk,
            blks=self.memory.blks,
            can_rotate=self.memory.can_swap_out,
        )
        decision = self.policy.schedule(state)
        for r in decision.preempt:
            if r.state is RUNNING:
                self._preempt(r, q, plan)
        return decision

    def _preempt(self, r: Request, q: RequestQueues, plan: StepPlan) -> None:
        """RUNNING -> ROTARY with its KV swapped out; without KV worth keeping or host
        space for it, RUNNING -> WAITING to recompute."""
        r.num_preemptions += 1
        plan.preempted.append(r.id)
        if r.num_computed_tokens and self.memory.can_swap_out(r):
            self.memory.swap_out(r)
            q.move(r, ROTARY, landing=not self.memory.has_landed(r))
            return
        self.memory.free(r)
        r.num_computed_tokens = 0
        q.move(r, WAITING)

    def _admit(
        self, r: Request, q: RequestQueues, plan: StepPlan, now: float, tokens: int
    ) -> int | None:
        """Bring ``r`` onto the device; the batch tokens it took, or None if it did not fit."""
        used = 0
        if r.state is ROTARY:
            if not self.memory.can_swap_in(r):
                return None
            self.memory.swap_in(r)
            plan.swapped_in.append(r.id)
            self._joining.append(r)
        else:
            if r.state is not WAITING:
                raise ValueError(f"policy {self.policy.name} admits {r.state.name} {r.id!r}")
            if tokens <= 0 or not self.memory.can_allocate(r):
                return None
            self.memory.allocate(r)
            plan.admitted.append(r.id)
            used = self._add_chunk(plan, r, tokens)
        q.move(r, RUNNING)
        r.t_run = now
        return used

    @staticmethod
    def _add_chunk(plan: StepPlan, r: Request, tokens: int) -> int:
        pending = r.num_pending_tokens
        n = min(pending, tokens)
        entry = (r.id, r.model, n, r.num_computed_tokens, True, n == pending)
        plan.batch.append(_entry(BatchEntry, entry))
        return n

    def _finish(self, r: Request, now: float) -> None:
        self.memory.free(r)
        self.queues[r.model].move(r, RequestState.FINISHED)
        del self.requests[r.id]
        r.t_finish = now
        self._released.append(r.id)
