"""The Scheduler: live requests in, one StepPlan per step out, results applied back.

It composes tenancy and its inputs (which models execute: ``tenancy``, ``turns``), the
remapper (weights lent to the KV cache), KVMemory (where) and the per-model queues with
the parts every policy shares: decode first with passive preemption (``decodes``), the
policy's decision, chunked prefill under a token budget and admission (``admission``),
and moving KV capacity between models (``capacity``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shunter.engine.config import EngineConfig, ModelSpec, TenantSpec
from shunter.engine.memory.bounds import KvBounds
from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.plan import StepPlan, StepResult
from shunter.engine.remap.remapper import Remapper
from shunter.engine.remap.timing import LayerTiming
from shunter.engine.request import Request, RequestState
from shunter.engine.sched.admission import Admission
from shunter.engine.sched.batch import add_decodes, least_slack
from shunter.engine.sched.capacity import Capacity
from shunter.engine.sched.decodes import Decodes
from shunter.engine.sched.first_tokens import FirstTokens
from shunter.engine.sched.pacing import Pacing
from shunter.engine.sched.policy import Policy
from shunter.engine.sched.preemption import Preemptor
from shunter.engine.sched.pressure import KvBytes
from shunter.engine.sched.queues import RequestQueues
from shunter.engine.sched.shares import fair_shares
from shunter.engine.sched.step_budget import StepBudget, StepShape
from shunter.engine.sched.tenancy import Tenancy
from shunter.engine.sched.turns import Turns

RUNNING, WAITING, FINISHED = RequestState.RUNNING, RequestState.WAITING, RequestState.FINISHED


class Scheduler:
    """Plans steps for every model of one engine.

    Step order (``schedule``):
      1. Tenancy: the models that execute this step (spatial ones with work and the
         temporal turn holder).
      2. Remapping (with a remapper): the controller weighs the executing models' KV
         demand against the free KV and lends or restores weight frames.
      3. Models beyond their KV floor give back what they took of floors since
         recalled: requests are preempted for it (``Capacity.repay``).
         Decode first (``Decodes.reserve``): each running request of an executing model
         in decode gets a block for its next token, else passive preemption.
      4. The policy's decision, preemptions applied now (``Admission.decide``). LVF
         decides once over every executing model's requests (one VLT order, each
         request with its own SLO class, costs in bytes); the other policies decide per
         model. Without ``"rotation"`` in the capacity order LVF rotates nothing by
         choice: its transfer budget is 0, so it admits by VLT within the free KV and
         preempts nobody (passive preemption still frees blocks a decode lacks).
      5. Batch: decodes, then prefill chunks of running requests, within
         ``max_batch_tokens``; with a ``StepBudget`` (``step_target_s``) prefill
         tokens also within ``step_tokens`` less the decodes (at least the budget's
         least, so prompts progress under many decodes). The prefill tokens are split
         among the models with prefill work, max-min fair (``Admission.fill``).
         Without chunked prefill a model's step runs whole prompts or, when it has none
         to run, decodes (vLLM V0's scheduling, ``_prompts_first``).
      6. Admissions in the decision's order (``Admission.fill``): waiting requests get
         blocks and a first prefill chunk; rotary requests are swapped in.
      7. The turn passes on when its holder could do nothing (``Turns.end_step``).
         Eager rotation of SYNCED blocks. The part of each KV floor its model cannot
         use now is lent, the rest recalled (``Capacity.lend_floors``). A model that
         ran short of blocks gets capacity from the others (``Capacity.reclaim``).
      8. Each batch entry's block table and tokens go into the plan, so the executor
         reads nothing but the plan.
      9. The plan's tokens count as computed and its samples as placeholders
         (``Request.num_output_placeholders``): the next step may be planned before
         this one's tokens are known (async scheduling). A request whose last token the
         plan samples retires: it gives its memory back now (what the plan writes
         lands before any later plan's copies and passes run) and plans no more.
    ``update`` applies the executor's result: tokens, and the requests that finished
    (retired, stopped). A request that stopped while a later plan already held it
    wastes that plan's entry, which ``update`` then skips.

    A swapped-in request joins the batch at the first step that finds its own H2D
    copies complete (``Admission.join``). Swap copies still in flight count against
    B_xfer, so rotation never plans more than the link moves.

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
        self.remapper = remapper
        tenants = list(config.tenant_by_model.values())
        self.tenancy = Tenancy(tenants, min_quantum_s=config.scheduler.turn_quantum_s)
        self.queues = {spec.name: RequestQueues() for spec in config.models}
        # Without chunked prefill, the prompt tokens a step of each model may hold: a
        # context at most, as vLLM's max_num_batched_tokens (max_model_len) there.
        self._prompt_tokens = {spec.name: self._prompt_cap(spec) for spec in config.models}
        self.turns = Turns(self.queues, self.tenancy)
        self.requests: dict[str, Request] = {}
        self.kv = KvBytes(memory, self.queues, config.scheduler)
        # Rotation is a source of memory only where the capacity order lists it.
        self.rotates = policy.rotates and "rotation" in config.remap.capacity_order
        self._released: list[str] = []
        # Requests whose last token a plan in flight samples, by id, with that plan's
        # step (step 9).
        self._retiring: dict[str, tuple[int, Request]] = {}
        target = config.scheduler.step_target_s
        self.step_budget = (
            None
            if target is None
            else StepBudget(target, max_tokens=config.scheduler.max_batch_tokens)
        )
        self.last_step_tokens: int | None = None
        self.num_recorded = 0  # tokens the last ``update`` gave requests
        swap = config.scheduler.preemption == "swap"
        # The last step's duration is Admission's (``update`` sets it); built below.
        self.preemptor = preemptor = Preemptor(
            memory, swap=swap, victim=policy.passive_victim, step_s=lambda: self.admission.step_s
        )
        self.decodes = Decodes(memory, self.queues, self.kv, preemptor)
        self.pacing = Pacing(self.queues, self.tenancy) if policy.paces else None
        self.capacity = Capacity(self.kv, preemptor)
        self.admission = Admission(
            memory=memory,
            queues=self.queues,
            kv=self.kv,
            capacity=self.capacity,
            tenancy=self.tenancy,
            policy=policy,
            rotates=self.rotates,
            max_running=config.scheduler.max_running,
            swap=swap,
            link_bytes_per_s=config.scheduler.link_bytes_per_s,
        )

    @property
    def policy(self) -> Policy:
        """The policy that decides (``Admission.policy``); replaceable between steps."""
        return self.admission.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.admission.policy = policy

    @property
    def num_passive_preemptions(self) -> int:
        return self.decodes.num_passive_preemptions

    def set_xfer_budget(self, blocks: int) -> None:
        """B_xfer from the next step on: ``blocks`` of the largest block size a step may
        rotate. A driver that knows what its host link moves within a step sets it each
        step (the simulator does, unless a run fixes B_xfer)."""
        if blocks != self.config.xfer_budget_blocks:
            self.config = dataclasses.replace(self.config, xfer_budget_blocks=blocks)
            self.kv.config = self.config

    # -- requests --------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.model not in self.queues:
            raise ValueError(f"request {request.id!r}: unknown model {request.model!r}")
        if request.id in self.requests:
            raise ValueError(f"request {request.id!r} already exists")
        if request.state is not WAITING or request.num_computed_tokens:
            raise ValueError(f"request {request.id!r} must arrive WAITING with no KV")
        tokens = request.max_num_tokens
        if not self.config.chunked_prefill and tokens > self._prompt_tokens[request.model]:
            # A recompute prefills the whole context in one step.
            raise ValueError(
                f"request {request.id!r} may reach {tokens} tokens; without chunked prefill "
                f"a step of {request.model!r} prefills at most {self._prompt_tokens[request.model]}"
            )
        beyond = self.memory.out_of_reach(request.model, tokens)
        if beyond is not None:
            raise ValueError(
                f"request {request.id!r} needs {beyond[0]} KV blocks; model "
                f"{request.model!r} has {beyond[1]}"
            )
        self.requests[request.id] = request
        self.queues[request.model].waiting[request.id] = request

    def abort(self, request_id: str, now: float) -> Request | None:
        """End a live request and free everything it holds; None if it is not live."""
        request = self.requests.get(request_id)
        if request is None:
            retiring = self._retiring.pop(request_id, None)
            if retiring is None:
                return None
            request = retiring[1]  # its memory is already free
            request.aborted = True
            _end(request, now)
            return request
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
        does not serve, two specs of one model, KV floors that add up to more than the
        pages the weights leave, or bounds under which a live request could never fit.
        """
        given = [t.model for t in tenants]
        if len(set(given)) != len(given) or not set(given) <= self.queues.keys():
            raise ValueError(f"tenants must name distinct served models: {given}")
        by_model = {t.model: t for t in tenants}
        specs = [by_model.get(m, TenantSpec(m)) for m in self.queues]
        bounds = KvBounds(specs)
        memory = self.memory
        for r in self.requests.values():
            beyond = memory.out_of_reach(r.model, r.max_num_tokens, bounds)
            if beyond is not None:
                raise ValueError(
                    f"request {r.id!r} needs {beyond[0]} KV blocks; model {r.model!r} would "
                    f"have {beyond[1]}"
                )
        memory.set_bounds(bounds)  # first: it raises when the floors do not fit
        self.tenancy.set_tenants(specs)
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
        self._prompt_tokens[spec.name] = self._prompt_cap(spec)
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
        del self.queues[model], self.kv.block_bytes[model], self._prompt_tokens[model]
        self.tenancy.remove_tenant(model)
        self.memory.set_bounds(KvBounds(self.tenancy.tenants.values()))
        if self.remapper is not None:
            self.remapper.remove_model(model)
        if self.pacing is not None:
            self.pacing.forget(model)

    def _prompt_cap(self, spec: ModelSpec) -> int:
        return min(self.config.max_batch_tokens, spec.max_context)

    @property
    def step_tokens(self) -> int:
        """The token budget of a step: the last one the ``StepBudget`` gave (its whole-
        step estimate before any), else the fixed one."""
        if self.step_budget is None:
            return self.config.max_batch_tokens
        if self.last_step_tokens is None:
            return self.step_budget.tokens
        return self.last_step_tokens

    @property
    def num_running(self) -> int:
        return self.admission.num_running

    def count(self, state: RequestState) -> int:
        return sum(q.count(state) for q in self.queues.values())

    # -- one step --------------------------------------------------------------------------
    def schedule(self, now: float, step: int) -> StepPlan:
        plan = StepPlan(step=step, released=self._released)
        self._released = []
        sitting_out = self.admission.join(now)
        self.memory.begin_step(plan)
        for q in self.queues.values():
            q.land(self.memory.has_landed)
        urgency = self.turns.urgency(now)
        executing = self.tenancy.executing(now, self.turns.has_work, urgency)
        if self.rotates:
            # A paused model cannot use its floor until its turn: its floor does not hold
            # meanwhile, so the models that run may rotate its requests out and take
            # their memory and the rest of the floor, which is owed back once it holds
            # the turn (``Capacity.repay``). Kept, the floors of paused requests and of
            # idle models left the holder a few requests a step while its others waited
            # on the host. With no holder every floor holds: a temporal model's first
            # request finds its floor, as a spatial model's does.
            self.memory.suspend_floors(self.tenancy.paused)
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
                run_next=self.tenancy.run_next(self.turns.has_work, urgency),
                idle=not self.requests,
            )
        short: dict[str, int] = {}  # model -> KV bytes it lacked this step
        # Models paced out of this step keep their memory and their place: they only
        # batch nothing.
        stepping = executing if self.pacing is None else self.pacing.select(executing, now)
        self.capacity.repay(plan, now)
        decodes, prefills = self.decodes.reserve(stepping, plan, sitting_out, short, now)
        admit = self.admission.decide(stepping, plan, now, self.config.xfer_budget_blocks)
        if not self.config.chunked_prefill:
            self._prompts_first(plan, decodes, prefills, admit, short, now)
        else:
            if self.step_budget is None:
                tokens = add_decodes(plan, decodes, self.config.max_batch_tokens)
            else:
                prefills, admit, tokens = self._within_budget(
                    self.step_budget, plan, decodes, prefills, admit, now
                )
            self.admission.fill(plan, prefills, admit, tokens, short, now)
        self.capacity.add_starved(executing, short)
        self.capacity.lend_floors()
        self.turns.end_step(executing, plan, sitting_out, now)
        if self.remapper is not None:
            self.remapper.stream(plan)
        self.memory.rotate()
        vacating = 0 if self.remapper is None else self.remapper.vacating_bytes
        self.capacity.reclaim(short, executing, self.turns.urgency(now), vacating)
        self.memory.end_step()
        self._inputs(plan)
        self._advance(plan)
        return plan

    def _inputs(self, plan: StepPlan) -> None:
        """What the executor reads for each batch entry (``StepPlan.block_tables``,
        ``token_ids``), taken once the step's moves are planned."""
        block_ids, requests = self.memory.block_ids, self.requests
        plan.block_tables = {e.request_id: block_ids(e.request_id) for e in plan.batch}
        plan.token_ids = {
            e.request_id: r.token_ids(e.num_computed_tokens, e.num_computed_tokens + e.num_tokens)
            for e in plan.batch
            if (r := requests[e.request_id]).prompt_token_ids is not None
        }

    def _advance(self, plan: StepPlan) -> None:
        """Count the plan's tokens as computed and its samples as placeholders; retire
        the requests it samples the last token of (step 9)."""
        requests, memory = self.requests, self.memory
        for e in plan.batch:
            r = requests[e.request_id]
            r.num_computed_tokens += e.num_tokens
            memory.mark_computed(r)
            if e.samples:
                r.num_output_placeholders += 1
                if r.has_all_tokens:
                    self._release(r)
                    self._retiring[r.id] = (plan.step, r)

    def _prompts_first(
        self,
        plan: StepPlan,
        decodes: list[Request],
        prefills: list[Request],
        admit: list[Request],
        short: dict[str, int],
        now: float,
    ) -> None:
        """Without chunked prefill, as vLLM's V0 scheduler (``_schedule_default``), each
        model like an engine of its own: whole prompts first, within the model's prompt
        tokens (``_prompt_tokens``); a model that prefills this step runs no decodes
        (they keep their blocks and go next step), the others decode. Decode entries
        stay ahead of prompts in the batch."""
        self.admission.fill(plan, prefills, admit, 0, short, now, whole=self._prompt_tokens)
        prompts = list(plan.batch)
        prefilling = {e.model for e in prompts}
        plan.batch.clear()
        decoding = [r for r in decodes if r.model not in prefilling]
        add_decodes(plan, decoding, self.config.max_batch_tokens)
        plan.batch.extend(prompts)

    def _within_budget(
        self,
        budget: StepBudget,
        plan: StepPlan,
        decodes: list[Request],
        prefills: list[Request],
        admit: list[Request],
        now: float,
    ) -> tuple[list[Request], list[Request], int]:
        """Batch the decodes that fit the step budget; return the prompts that may run,
        the admissions and the prompt tokens left. First tokens first (``FirstTokens``);
        then decodes and prompts split the budget max-min fairly (the budget's least
        chunk at least), so that a step of hundreds of decodes does not outlast the
        target either and prompts still progress beside them. Decodes beyond their
        share wait a step, the most slack first."""
        work = self._work(decodes, prefills, admit)
        total = budget.tokens_for(work.shape)
        first = FirstTokens.of(
            admit,
            total,
            budget.target_s,
            now,
            self.memory.can_allocate,
            prefills=prefills,
            decodes=decodes,
        )
        if first.light:  # the step runs less: its budget is that work's
            prefills, admit = first.prompts(prefills), first.prompts(admit)
            decodes = first.decodes(decodes)
            work = self._work(decodes, prefills, admit)
            total = budget.tokens_for(work.shape)
        self.last_step_tokens = total
        share = work.decode_share(total)
        num_decodes = share - add_decodes(plan, least_slack(decodes, share, now), share)
        tokens = min(self.config.max_batch_tokens, total) - num_decodes
        return prefills, admit, tokens

    def _work(
        self, decodes: list[Request], prefills: list[Request], admit: list[Request]
    ) -> _StepWork:
        """The step's work as ``Admission.fill`` will see it (``prefill_demand``)."""
        running, waiting = self.admission.prefill_demand(prefills, admit)
        # The requests whose tokens ``prefill_demand`` counts, and the decodes, by model.
        seqs = Counter(r.model for r in prefills if r.state is RUNNING)
        seqs.update(r.model for r in admit if r.state is WAITING)
        decoding = Counter(r.model for r in decodes)
        prompts = {m: running.get(m, 0) + waiting.get(m, 0) for m in running | waiting}
        return _StepWork(decoding, prompts, seqs, self.config.max_batch_tokens)

    def update(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        """Apply the executor's result at time ``now``; return the requests that finished.
        ``num_recorded`` is then the tokens it gave requests (the result's less the
        wasted ones of requests that ended since the plan was made)."""
        if self.step_budget is not None:
            tokens = dict.fromkeys(result.compute_s, 0)
            for entry in plan.batch:
                if entry.model in tokens:
                    tokens[entry.model] += entry.num_tokens
            passes = {m: (tokens[m], seconds) for m, seconds in result.compute_s.items()}
            self.step_budget.observe(
                plan.num_batch_tokens, result.duration_s, passes, num_seqs=len(plan.batch)
            )
        self.admission.step_s = result.duration_s
        if self.pacing is not None:
            self.pacing.observe(result.compute_s)
        if self.tenancy.turn_length.is_measuring:  # only the steps after a switch
            self.tenancy.observe(
                {entry.model for entry in plan.batch},
                now=now,
                duration_s=result.duration_s,
                compute_s=sum(result.compute_s.values()) if result.compute_s else None,
            )
        finished = []
        self.num_recorded = 0
        for entry in plan.batch:
            if not entry.samples:
                continue
            r = self.requests.get(entry.request_id)
            retiring = None if r is not None else self._retiring.get(entry.request_id)
            if retiring is not None:
                r = retiring[1]
            if r is None:  # stopped by an earlier step, or aborted, since planned
                continue
            if r.id not in result.emitted:
                raise RuntimeError(f"step {plan.step}: no token for request {r.id!r}")
            r.record_token(now, result.emitted[r.id])
            self.num_recorded += 1
            if retiring is not None and (retiring[0] == plan.step or r.id in result.stopped):
                # Its last token, or a stop before the plan that retired it.
                del self._retiring[r.id]
                _end(r, now)
                finished.append(r)
            elif r.id in result.stopped:
                self._finish(r, now)
                finished.append(r)
        return finished

    def _finish(self, r: Request, now: float) -> None:
        self._release(r)
        _end(r, now)

    def _release(self, r: Request) -> None:
        """Free everything ``r`` holds and take it off the queues."""
        self.memory.free(r)
        self.queues[r.model].move(r, FINISHED)
        self.tenancy.memory_changed()
        del self.requests[r.id]
        self._released.append(r.id)


def _end(r: Request, now: float) -> None:
    """``r`` finished at ``now``: what later plans would still sample is dropped."""
    r.t_finish = now
    r.num_output_placeholders = 0


@dataclass(frozen=True)
class _StepWork:
    """The work a budgeted step chooses from, per model: ``decodes``, pending ``prompts``
    tokens (running prompts and admissions) and the ``prompt_seqs`` that hold them; and
    how a budget of some total tokens would split it (``shape``): decodes and prompts
    max-min fairly, each side's tokens among the models max-min fairly, as
    ``Scheduler._within_budget`` and ``Admission.fill`` do."""

    decodes: Mapping[str, int]
    prompts: Mapping[str, int]
    prompt_seqs: Mapping[str, int]
    max_tokens: int

    def decode_share(self, total: int) -> int:
        demand = {"decodes": sum(self.decodes.values()), "prompts": sum(self.prompts.values())}
        return fair_shares(demand, total)["decodes"]

    def shape(self, total: int) -> StepShape:
        share = self.decode_share(total)
        tokens = fair_shares(self.decodes, share)
        chunks = fair_shares(self.prompts, min(self.max_tokens, total) - share)
        seqs = share + sum(min(self.prompt_seqs[m], n) for m, n in chunks.items())
        for m, n in chunks.items():
            tokens[m] = tokens.get(m, 0) + n
        return StepShape(tokens, seqs)
