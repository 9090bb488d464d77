"""The Scheduler: live requests in, one StepPlan per step out, results applied back.

It composes tenancy (which models execute), the remapper (weights lent to the KV
cache), the policy (who runs), KVMemory (where) and the per-model queues, and owns the
parts every policy shares: decode first with passive preemption, chunked prefill
under a token budget, the cross-iteration pipeline, eager rotation, and moving KV
capacity between models.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Sequence
from operator import attrgetter

from shunter.engine.config import EngineConfig, ModelSpec, TenantSpec
from shunter.engine.memory.bounds import KvBounds
from shunter.engine.memory.manager import KVMemory
from shunter.engine.plan import BatchEntry, StepPlan, StepResult
from shunter.engine.remap.remapper import Remapper
from shunter.engine.remap.timing import LayerTiming
from shunter.engine.request import Request, RequestState, vlts
from shunter.engine.sched.kv_bytes import KvBytes
from shunter.engine.sched.policy import Policy, PolicyInput
from shunter.engine.sched.queues import RequestQueues
from shunter.engine.sched.shares import fair_shares
from shunter.engine.sched.step_budget import StepBudget
from shunter.engine.sched.tenancy import Tenancy

RUNNING, ROTARY, WAITING = RequestState.RUNNING, RequestState.ROTARY, RequestState.WAITING
FINISHED = RequestState.FINISHED

# tuple.__new__ builds a BatchEntry in C at half the cost of its Python __new__: a step
# makes one per running request.
_entry = tuple.__new__


class Scheduler:
    """Plans steps for every model of one engine.

    Step order (``schedule``):
      1. Tenancy: the models that execute this step (spatial ones with work and the
         temporal turn holder).
      2. Remapping (with a remapper): the controller weighs the executing models' KV
         demand against the free KV and lends or restores weight frames.
      3. Decode first: each running request of an executing model in decode gets a
         block for its next token; when none is free it waits for blocks already being
         released, or else the latest arrival of its model is preempted (passive
         preemption).
      4. The policy's decision, preemptions applied now. LVF decides once over every
         executing model's requests (one VLT order, each request with its own SLO
         class, costs in bytes; running requests of models that do not execute are
         preemption candidates too when their model holds KV beyond its floor, memory
         the others can use); the other policies decide per model, like separate
         serving instances, and their admissions merge by arrival. Without
         ``"rotation"`` in the capacity order LVF rotates nothing by choice: its
         transfer budget is 0, so it admits by VLT within the free KV and preempts
         nobody (passive preemption still frees blocks a decode lacks).
      5. Batch: decodes, then prefill chunks of running requests, within
         ``max_batch_tokens``; with a ``StepBudget`` (``step_target_s``) prefill
         tokens also within ``step_tokens`` less the decodes (at least the budget's
         least, so prompts progress under many decodes). The prefill tokens are split
         among the models with prefill work, max-min fair (``shares``), so one
         model's long prompt or burst never holds a step while another model's
         request waits; each model spends its share on its running chunks first.
         With a step budget, a step that admits another model's request keeps each
         model's running chunks to the budget's least (first tokens first).
      6. Admissions in the decision's order: waiting requests get blocks and a first
         prefill chunk from their model's share; rotary requests are swapped in (their
         H2D overlaps this step's forward pass). A request that does not fit stops its
         own model's admissions for this step, not the others'.
      7. Eager rotation of SYNCED blocks. A model that ran short of blocks gets
         capacity from the others: the one with the most free blocks compacts.
    ``update`` applies the executor's result: KV progress, tokens, finished requests.

    A swapped-in request joins the batch at the first step that finds its own H2D
    copies complete: the next one when they take less than a step. Until then it holds
    its blocks and sits out, so no step waits on another request's copies; its
    ``t_run`` is the current step until it joins, so it runs before it can rotate
    again. Swap copies still in flight count against B_xfer, so rotation never plans
    more than the link moves.

    ``num_passive_preemptions`` counts the preemptions decodes forced (step 3); every
    other preemption is the policy's choice.
    """

    def __init__(
        self,
        config: EngineConfig,
        memory: KVMemory,
        policy: Policy,
        remapper: Remapper | None = None,
    ) -> None:
        self.config = config.scheduler
        self.memory = memory
        self.policy = policy
        self.remapper = remapper
        tenants = list(config.tenant_by_model.values())
        self.tenancy = Tenancy(tenants, min_quantum_s=config.scheduler.turn_quantum_s)
        self.queues = {spec.name: RequestQueues() for spec in config.models}
        self.requests: dict[str, Request] = {}
        self.kv = KvBytes(memory, self.queues, config.scheduler)
        # Rotation is a source of memory only where the capacity order lists it.
        self.rotates = policy.rotates and "rotation" in config.remap.capacity_order
        link = config.scheduler.link_bytes_per_s
        self._swap_s = None if link is None else self._round_trip(link)
        self.num_passive_preemptions = 0
        self._released: list[str] = []
        self._joining: list[Request] = []
        target = config.scheduler.step_target_s
        self.step_budget = (
            None
            if target is None
            else StepBudget(target, max_tokens=config.scheduler.max_batch_tokens)
        )

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

    def set_tenants(self, tenants: Sequence[TenantSpec]) -> None:
        """Replace the tenancy (sharing modes, priorities, SLO classes, KV floors and
        ceilings) between steps, in place; a model without a spec gets the defaults
        (spatial, priority 0, unbounded).

        Everything else stays: every request where it is, the turn holder if it stays
        temporal, when each model last executed, the switch count, the layers lent.
        A model that changes sharing mode executes as its new mode from the next step
        on. Live requests keep the SLO class they arrived with (the tenant's class is
        for new ones). Raises ValueError, changing nothing, for a model this engine
        does not serve, two specs of one model, or bounds under which a live request
        could never fit.
        """
        given = [t.model for t in tenants]
        if len(set(given)) != len(given) or not set(given) <= self.queues.keys():
            raise ValueError(f"tenants must name distinct served models: {given}")
        by_model = {t.model: t for t in tenants}
        specs = [by_model.get(m, TenantSpec(m)) for m in self.queues]
        bounds = KvBounds(specs)
        memory = self.memory
        for r in self.requests.values():
            need = memory.num_blocks(r.prompt_tokens + r.max_output_tokens)
            room = memory.num_total_blocks(r.model, bounds)
            if need > room:
                raise ValueError(
                    f"request {r.id!r} needs {need} KV blocks; model {r.model!r} would have {room}"
                )
        self.tenancy.set_tenants(specs)
        memory.set_bounds(bounds)
        if self.remapper is not None:
            self.remapper.set_priorities({t.model: t.priority for t in specs})

    def add_model(self, spec: ModelSpec, tenant: TenantSpec, timing: LayerTiming | None) -> None:
        """Serve one more model from the next step on: its weights placed in the arena
        (``KVMemory.add_model``; ``check_room`` first), empty queues, its tenancy, and
        with a remapper its ``timing``. ValueError when it does not fit."""
        if spec.name in self.queues:
            raise ValueError(f"model {spec.name!r} is served already")
        if self.remapper is not None and timing is None:
            raise ValueError(f"remapping needs the timing of {spec.name!r}")
        self.memory.add_model(spec)
        self.queues[spec.name] = RequestQueues()
        self.kv.block_bytes[spec.name] = self.memory.block_bytes(spec.name)
        self.tenancy.add_tenant(tenant)
        self.memory.set_bounds(KvBounds(self.tenancy.tenants.values()))
        if self.remapper is not None and timing is not None:
            self.remapper.add_model(spec, timing, tenant.priority)

    def remove_model(self, model: str) -> None:
        """Stop serving a model: every page it holds goes back to the free pages.
        ValueError, changing nothing, while it has live requests or copies in flight
        (``KVMemory.can_remove_model``)."""
        if self.queues[model]:
            raise ValueError(f"model {model!r} still has live requests")
        self.memory.remove_model(model)
        del self.queues[model], self.kv.block_bytes[model]
        self.tenancy.remove_tenant(model)
        self.memory.set_bounds(KvBounds(self.tenancy.tenants.values()))
        if self.remapper is not None:
            self.remapper.remove_model(model)

    @property
    def step_tokens(self) -> int:
        """The token budget of the next step: the ``StepBudget``'s, else the fixed one."""
        if self.step_budget is None:
            return self.config.max_batch_tokens
        return self.step_budget.tokens

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
        lag = self._lag(now)
        executing = self.tenancy.executing(now, self._has_work, lag)
        if self.remapper is not None:
            pressure = self.kv.pressure(
                executing,
                sitting_out,
                now=now,
                num_running=self.num_running,
                rotates=self.rotates,
            )
            self.remapper.plan(
                plan,
                pressure,
                active={m for m in self.queues if self.tenancy.is_active(m)},
                t_last_active=self.tenancy.t_last_active,
                run_next=self.tenancy.run_next(self._has_work, lag),
                idle=not self.requests,
            )
        short: dict[str, int] = {}  # model -> KV bytes it lacked this step
        decodes: list[Request] = []
        prefills: list[Request] = []
        for model in executing:
            reserved, prefilling = self._reserve_decodes(model, plan, sitting_out, short)
            decodes += reserved
            prefills += prefilling
        admit = self._decide(executing, plan, now)

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
        if self.step_budget is not None:
            budget = self.step_budget
            num_decodes = self.config.max_batch_tokens - tokens
            tokens = min(tokens, max(budget.min_tokens, budget.tokens - num_decodes))
        # Prefill tokens are shared fairly by model: one model's long prompt or burst
        # does not hold a step while another's request waits (see ``shares``).
        running, waiting = self._prefill_demand(prefills, admit)
        demand = {m: running.get(m, 0) + waiting.get(m, 0) for m in running | waiting}
        left = fair_shares(demand, tokens)
        for r in prefills:
            room = min(left.get(r.model, 0), running.get(r.model, 0))
            if r.state is RUNNING and room > 0:
                chunk = self._add_chunk(plan, r, room)
                left[r.model] -= chunk
                running[r.model] -= chunk

        num_running = self.num_running
        stopped: set[str] = set()
        skipped: list[Request] = []
        for r in admit:
            if num_running >= self.config.max_running:
                break
            if r.model in stopped:
                skipped.append(r)
                continue
            model_tokens = left.get(r.model, 0)
            used = self._admit(r, plan, now, model_tokens)
            if used is None:
                stopped.add(r.model)
                if model_tokens > 0 or r.state is ROTARY:
                    short[r.model] = short.get(r.model, 0) + self._lack(r)
                continue
            num_running += 1
            if used:
                left[r.model] -= used
        # What a short model's admissions behind the one that did not fit would have taken.
        for r, nbytes in zip(skipped, self.kv.of(skipped), strict=True):
            if r.model in short:
                short[r.model] += nbytes
        for m in executing:
            if m not in short:
                lack = self._starved(m)
                if lack:
                    short[m] = lack
        holder = self.tenancy.holder
        if holder in executing:
            if self._progressed(holder, plan, sitting_out):
                self.tenancy.memory_changed()
            else:
                self.tenancy.pass_turn(now, self._has_work, self._lag(now))  # queues changed
        if self.remapper is not None:
            self.remapper.stream(plan)
        self.memory.rotate()
        # Capacity moves to the models that ran short, and to frames being restored:
        # the other model with the most free blocks compacts (one a step: moves cost
        # copies). A model that executed gives back what they lack and no more: it
        # would claim the rest again, chunks thrashing between pools every step. One
        # that did not gives back every empty chunk, so that the free pages, not
        # rotation, serve the next steps' admissions.
        need = sum(short.values())
        others = [m for m in self.queues if m not in short]
        if len(short) > 1 and not any(map(self.memory.num_held_free_blocks, others)):
            # Every model holding free blocks is short itself: the one lagging most is
            # served and the others give back to it, or no one would ever get enough.
            first = max(short, key=self._lag(now))
            need = short[first]
            others = [m for m in short if m != first]
        if self.remapper is not None:
            need += self.remapper.vacating_bytes
        if need and others:
            donor = max(others, key=self.memory.num_held_free_blocks)
            self.memory.compact(donor, need if donor in executing else None)
        self.memory.end_step()
        return plan

    def update(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        """Apply the executor's result at time ``now``; return the requests that finished."""
        if self.step_budget is not None:
            self.step_budget.observe(plan.num_batch_tokens, result.duration_s)
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
        self, model: str, plan: StepPlan, sitting_out: set[str], short: dict[str, int]
    ) -> tuple[list[Request], list[Request]]:
        """Blocks for the next token of each decoding request, oldest first.

        Returns the decoding requests that got a block and the running requests still
        in prefill, in running order, leaving out those whose swap-in copies are in
        flight (``sitting_out``). Out of blocks, a request waits for blocks already on
        their way (released by a preemption whose copies are in flight); if none are,
        the latest arrival is preempted (vLLM's passive preemption), possibly the
        request itself, and the model is ``short`` of the victim's blocks.
        """
        q = self.queues[model]
        decodes: list[Request] = []
        prefills: list[Request] = []
        memory = self.memory
        decoding: list[Request] = []
        for r in q.running.values():
            if r.id in sitting_out:
                continue
            # ``r.is_prefill`` inlined: this loop visits every running request each step.
            pending = r.prompt_tokens + r.num_output_tokens - r.num_computed_tokens
            if r.num_output_tokens == 0 or pending > 1:
                prefills.append(r)
            else:
                decoding.append(r)
        incoming = memory.num_incoming_blocks(model)
        # Most decodes write into a block they hold: no memory verb to call for them.
        for r, need in zip(decoding, memory.num_append_blocks(decoding, 1), strict=True):
            if r.state is not RUNNING:  # preempted below for an earlier one
                continue
            if need <= 0:
                decodes.append(r)
                continue
            while not memory.can_append(r, 1):
                if incoming > 0:
                    incoming -= 1
                    break
                victim = max(q.running.values(), key=lambda v: v.t_arr)
                short[model] = short.get(model, 0) + self.kv.of((victim,))[0]
                self._preempt(victim, plan)
                self.num_passive_preemptions += 1
                incoming = memory.num_incoming_blocks(model)
                if victim is r:
                    break
            else:
                memory.append(r, 1)
                decodes.append(r)
        return decodes, prefills

    def _priority(self, r: Request) -> int:
        return self.tenancy.tenants[r.model].priority

    def _round_trip(self, link_bytes_per_s: float) -> Callable[[Request], float]:
        """Seconds to copy a running request's KV out and back in over the link."""
        memory, bb = self.memory, self.kv.block_bytes

        def swap_s(r: Request) -> float:
            return 2 * memory.blk(r) * bb[r.model] / link_bytes_per_s

        return swap_s

    def set_xfer_budget(self, blocks: int) -> None:
        """B_xfer from the next step on: ``blocks`` of the largest block size a step may
        rotate. A driver that knows what its host link moves within a step sets it each
        step (the simulator does, unless a run fixes B_xfer)."""
        if blocks != self.config.xfer_budget_blocks:
            self.config = dataclasses.replace(self.config, xfer_budget_blocks=blocks)
            self.kv.config = self.config

    def _decide(self, executing: list[str], plan: StepPlan, now: float) -> list[Request]:
        """Apply the policy's preemptions; return its admissions in order."""
        memory, slots = self.memory, max(0, self.config.max_running - self.num_running)
        budget = self.config.xfer_budget_blocks
        if self.policy.rotates:
            # One decision over every executing model, in bytes: the policy only compares
            # costs with free memory and the budget, so any one unit serves.
            bb = self.kv.block_bytes
            xfer = budget * max(bb[m] for m in executing) if executing and self.rotates else 0
            decisions = [
                self.policy.schedule(
                    PolicyInput(
                        model="*",
                        now=now,
                        running=[
                            r
                            for m, q in self.queues.items()
                            if m in executing or memory.above_floor(m)
                            for r in q.running.values()
                        ],
                        waiting=[r for m in executing for r in self.queues[m].waiting.values()],
                        rotary=[r for m in executing for r in self.queues[m].rotary.values()],
                        num_free_blocks=self.kv.free(executing),
                        num_free_slots=slots,
                        xfer_budget=max(0, xfer - memory.swap_bytes_in_flight),
                        blk=lambda r: memory.blk(r) * bb[r.model],
                        blks=self.kv.of,
                        can_rotate=memory.can_swap_out,
                        swap_s=self._swap_s,
                        priority=self._priority,
                    )
                )
            ]
        else:
            moved = memory.num_swap_blocks_in_flight
            decisions = [
                self.policy.schedule(
                    PolicyInput(
                        model=model,
                        now=now,
                        running=list(self.queues[model].running.values()),
                        waiting=list(self.queues[model].waiting.values()),
                        rotary=list(self.queues[model].rotary.values()),
                        num_free_blocks=memory.num_free_blocks(model),
                        num_free_slots=slots,
                        xfer_budget=max(0, budget - moved),
                        blk=memory.blk,
                        blks=memory.blks,
                        can_rotate=memory.can_swap_out,
                    )
                )
                for model in executing
            ]
        for decision in decisions:
            for r in decision.preempt:
                if r.state is RUNNING:
                    self._preempt(r, plan)
        if len(decisions) == 1:
            return decisions[0].admit
        return list(heapq.merge(*(d.admit for d in decisions), key=attrgetter("t_arr")))

    def _starved(self, model: str) -> int:
        """KV bytes the model lacks to place a head of its queues, whichever lacks most:
        the first waiting request, the first rotary one in preemption order (WF's and
        SF's head) and the earliest arrival among them (FCFS's). A head that needs more
        blocks than the model may allocate is one the policy would not even try to
        admit, and the model's admissions wait behind it. 0 when every head fits (or
        there is none)."""
        q = self.queues[model]
        free = self.memory.num_free_blocks(model)
        heads = [next(iter(q.waiting.values()), None)]
        if q.rotary:
            heads.append(next(iter(q.rotary.values())))
            heads.append(min(q.rotary.values(), key=attrgetter("t_arr")))
        lacks = [self._lack(r) for r in heads if r is not None and self.memory.blk(r) > free]
        return max(lacks, default=0)

    def _lack(self, r: Request) -> int:
        """KV bytes ``r``'s model lacks to bring it onto the device (one block at least:
        it did not fit)."""
        memory = self.memory
        missing = max(1, memory.blk(r) - memory.num_free_blocks(r.model))
        return missing * self.kv.block_bytes[r.model]

    def _progressed(self, model: str, plan: StepPlan, sitting_out: set[str]) -> bool:
        """Whether ``model`` computes, brings a request in, or waits for copies of its
        own this step."""
        q = self.queues[model]
        return (
            bool(q.landing)
            or any(e.model == model for e in plan.batch)
            or any(rid in q.running for rid in plan.swapped_in)
            or any(rid in q.running for rid in sitting_out)
        )

    # -- tenancy and remapping inputs ---------------------------------------------------------
    def _has_work(self, model: str) -> bool:
        return len(self.queues[model]) > 0

    def _lag(self, now: float) -> Callable[[str], float]:
        """The VLT of a model's most lagging request, its running requests lagging as
        rotary ones while the model does not execute. Each answer is kept (the turn
        decision and the run-next order ask again): use it while the queues stay as
        they are."""
        known: dict[tuple[str, bool], float] = {}

        def lag(model: str) -> float:
            paused = not self.tenancy.is_active(model)
            value = known.get((model, paused))
            if value is None:
                q = self.queues[model]
                groups = (q.waiting, q.rotary, q.landing, q.running)
                vs = (v for g in groups if g for v in vlts(g.values(), now, paused=paused))
                value = known[model, paused] = max(vs)
            return value

        return lag

    def _preempt(self, r: Request, plan: StepPlan) -> None:
        """RUNNING -> ROTARY with its KV swapped out; without KV worth keeping or host
        space for it, or with ``preemption = "recompute"``, RUNNING -> WAITING to
        recompute."""
        q = self.queues[r.model]
        r.num_preemptions += 1
        plan.preempted.append(r.id)
        swaps = self.config.preemption == "swap"
        if swaps and r.num_computed_tokens and self.memory.can_swap_out(r):
            landed = self.memory.swap_out(r)
            q.move(r, ROTARY, landing=not landed)
            return
        self.memory.free(r)
        r.num_computed_tokens = 0
        q.move(r, WAITING)

    def _prefill_demand(
        self, prefills: list[Request], admit: list[Request]
    ) -> tuple[dict[str, int], dict[str, int]]:
        """Prefill tokens each model could batch this step: its running prompts' pending
        tokens, and those of its waiting requests the policy admits. With a step budget,
        first tokens go first: while another model has a request waiting to be admitted,
        a model's running prompts take at most the budget's least chunk, so the step that
        admits that request stays short (its first token comes one short step after it
        was admitted, not after a full chunk of someone's long prompt); the long prompts
        still progress every step."""
        running: dict[str, int] = {}
        waiting: dict[str, int] = {}
        for r in prefills:
            if r.state is RUNNING:
                running[r.model] = running.get(r.model, 0) + r.num_pending_tokens
        for r in admit:
            if r.state is WAITING:
                waiting[r.model] = waiting.get(r.model, 0) + r.num_pending_tokens
        if self.step_budget is not None:
            least = self.step_budget.min_tokens
            for m in running:
                if any(other != m for other in waiting):
                    running[m] = min(running[m], least)
        return running, waiting

    def _admit(self, r: Request, plan: StepPlan, now: float, tokens: int) -> int | None:
        """Bring ``r`` onto the device; the batch tokens it took, or None if it did not fit."""
        q = self.queues[r.model]
        used = 0
        if r.state is ROTARY:
            if not self.memory.try_swap_in(r):
                return None
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
        self.queues[r.model].move(r, FINISHED)
        self.tenancy.memory_changed()
        del self.requests[r.id]
        r.t_finish = now
        self._released.append(r.id)
