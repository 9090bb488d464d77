"""Admission: the policy's decision, the step's prefill tokens, and bringing requests in.

``decide`` asks the policy who to preempt and whom to bring onto the device, and
applies its preemptions. ``fill`` then spends the step's prefill tokens: split max-min
fair among the models with prefill work (``shares``), each model's share going to its
running prompts' chunks first, then to its admissions in the decision's order. A
swapped-in request sits out until its own H2D copies are complete (``join``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.plan import StepPlan
from shunter.engine.request import Request, RequestState
from shunter.engine.sched.batch import add_chunk
from shunter.engine.sched.capacity import Capacity
from shunter.engine.sched.policy import Policy, PolicyInput
from shunter.engine.sched.preemption import preempt
from shunter.engine.sched.pressure import KvBytes
from shunter.engine.sched.queues import RequestQueues
from shunter.engine.sched.shares import fair_shares
from shunter.engine.sched.tenancy import Tenancy

RUNNING, ROTARY, WAITING = RequestState.RUNNING, RequestState.ROTARY, RequestState.WAITING


@dataclass
class Admission:
    """Decides and carries out admissions over ``memory`` and the per-model ``queues``.

    ``policy`` decides (the Scheduler may replace it between steps). ``rotates``: the
    policy may rotate by choice, rotation being a source of memory in the capacity
    order; without it a rotating policy's transfer budget is 0. ``max_running`` caps the
    running requests of every model together; ``swap``: preempted requests rotate out
    when they can, else recompute; ``link_bytes_per_s``, where known, prices a
    rotation for the policy (``PolicyInput.swap_s``).
    """

    memory: KVMemory
    queues: Mapping[str, RequestQueues]
    kv: KvBytes
    capacity: Capacity
    tenancy: Tenancy
    policy: Policy
    rotates: bool
    max_running: int
    swap: bool
    link_bytes_per_s: float | None
    step_s: float | None = field(default=None, init=False)
    _joining: list[Request] = field(default_factory=list, init=False)
    _swap_s: Callable[[Request], float] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        link = self.link_bytes_per_s
        self._swap_s = None if link is None else self._round_trip(link)

    @property
    def num_running(self) -> int:
        return sum(len(q.running) for q in self.queues.values())

    def join(self, now: float) -> set[str]:
        """At the start of a step: the ids of the swapped-in requests that sit it out.

        A swapped-in request joins the batch at the first step that finds its own H2D
        copies complete. Until then it holds its blocks and sits out, so no step waits
        on another request's copies; its ``t_run`` is the current step until it joins,
        so its VLT is 0 at this step's decision and it runs before it can rotate again.
        """
        self._joining = [r for r in self._joining if r.state is RUNNING]
        for r in self._joining:
            r.t_run = now
        self._joining = [r for r in self._joining if not self.memory.is_resident(r)]
        return {r.id for r in self._joining}

    def decide(
        self, executing: Sequence[str], plan: StepPlan, now: float, xfer_budget_blocks: int
    ) -> list[Request]:
        """Apply the policy's preemptions; return its admissions in order.

        A rotating policy decides once over every executing model's requests, in bytes,
        with the running requests of models that do not execute as candidates too when
        their model holds KV beyond its floor; the others decide per model, in blocks,
        like separate serving instances, and their admissions merge by arrival.
        ``xfer_budget_blocks`` is B_xfer in blocks of the largest block size; what swap
        copies in flight take of it is left out.
        """
        memory, slots = self.memory, max(0, self.max_running - self.num_running)
        budget = xfer_budget_blocks
        if self.policy.rotates:
            # One decision over every executing model, in bytes: the policy only compares
            # costs with free memory and the budget, so any one unit serves.
            bb = self.kv.block_bytes
            xfer = budget * max(bb[m] for m in executing) if executing and self.rotates else 0
            room = self.kv.room(executing)
            decisions = [
                self.policy.schedule(
                    PolicyInput(
                        model="*",
                        now=now,
                        running=[
                            r
                            for m, q in self.queues.items()
                            if m in executing or m in room.movable
                            for r in q.running.values()
                        ],
                        waiting=[r for m in executing for r in self.queues[m].waiting.values()],
                        rotary=[r for m in executing for r in self.queues[m].rotary.values()],
                        num_free_blocks=room.total,
                        num_free_slots=slots,
                        xfer_budget=max(0, xfer - memory.swap_bytes_in_flight),
                        blk=lambda r: memory.blk(r) * bb[r.model],
                        blks=self.kv.of,
                        can_rotate=memory.can_swap_out,
                        swap_s=self._swap_s,
                        step_s=self.step_s,
                        priority=self._priority,
                        room=room,
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
                    preempt(r, plan, memory, self.queues[r.model], swap=self.swap)
        if len(decisions) == 1:
            return decisions[0].admit
        return list(heapq.merge(*(d.admit for d in decisions), key=attrgetter("t_arr")))

    def fill(
        self,
        plan: StepPlan,
        prefills: Sequence[Request],
        admit: Sequence[Request],
        tokens: int,
        short: dict[str, int],
        now: float,
        *,
        whole: Mapping[str, int] | None = None,
    ) -> None:
        """Spend ``tokens`` of prefill on the running ``prefills`` and on ``admit``.
        With ``whole`` (tokens per model, in place of ``tokens``) each model has its
        own tokens, and only whole prompts run (no chunking), the first that does not
        fit its model's tokens ending that model's admissions.

        The tokens are split max-min fair among the models with prefill work; each model
        spends its share on its running chunks first. Then ``admit``, in order, within
        ``max_running``: waiting requests get blocks and a first chunk from their model's
        share, rotary ones are swapped in (their H2D overlaps this step's forward pass).
        A request that does not fit stops its own model's admissions for this step, not
        the others'; its model is ``short`` of what it lacks (with tokens to spare, or
        for a swap-in) and of what its admissions behind it would have taken.
        """
        running, waiting = self.prefill_demand(prefills, admit)
        demand = {m: running.get(m, 0) + waiting.get(m, 0) for m in running | waiting}
        left = fair_shares(demand, tokens) if whole is None else dict(whole)
        for r in prefills:
            room = min(left.get(r.model, 0), running.get(r.model, 0))
            if whole is not None and room < r.num_pending_tokens:
                continue
            if r.state is RUNNING and room > 0:
                chunk = add_chunk(plan, r, room)
                self.memory.publish_scheduled(r, chunk)
                left[r.model] -= chunk
                running[r.model] -= chunk

        num_running = self.num_running
        stopped: set[str] = set()
        skipped: list[Request] = []
        for r in admit:
            if num_running >= self.max_running:
                break
            if r.model in stopped:
                skipped.append(r)
                continue
            model_tokens = left.get(r.model, 0)
            if whole is not None and r.state is WAITING and r.num_pending_tokens > model_tokens:
                stopped.add(r.model)  # short of tokens, not of memory
                continue
            used = self._admit(r, plan, now, model_tokens)
            if used is None:
                stopped.add(r.model)
                if model_tokens > 0 or r.state is ROTARY:
                    short[r.model] = short.get(r.model, 0) + self.capacity.lack(r)
                continue
            num_running += 1
            if used:
                left[r.model] -= used
        # What a short model's admissions behind the one that did not fit would have taken.
        for r, nbytes in zip(skipped, self.kv.of(skipped), strict=True):
            if r.model in short:
                short[r.model] += nbytes

    def prefill_demand(
        self, prefills: Sequence[Request], admit: Sequence[Request]
    ) -> tuple[dict[str, int], dict[str, int]]:
        """Prefill tokens each model could batch this step: its running prompts' pending
        tokens, and those of its waiting requests the policy admits. Prompts that wait a
        step for a light model's first tokens are not among ``prefills`` and ``admit`` at
        all (``first_tokens``)."""
        running: dict[str, int] = {}
        waiting: dict[str, int] = {}
        for r in prefills:
            if r.state is RUNNING:
                running[r.model] = running.get(r.model, 0) + r.num_pending_tokens
        for r in admit:
            if r.state is WAITING:
                waiting[r.model] = waiting.get(r.model, 0) + r.num_pending_tokens
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
            if self.memory.is_resident(r):
                used = add_chunk(plan, r, tokens)
                self.memory.publish_scheduled(r, used)
            else:  # its cached prefix is copied in from host first: it joins like a swap-in
                plan.prefix_loads.append(r.id)
                self._joining.append(r)
        q.move(r, RUNNING)
        r.t_run = now
        if r.t_scheduled is None:
            r.t_scheduled = now
        return used

    def _priority(self, r: Request) -> int:
        return self.tenancy.tenants[r.model].priority

    def _round_trip(self, link_bytes_per_s: float) -> Callable[[Request], float]:
        """Seconds to copy a running request's KV out and back in over the link."""
        memory, bb = self.memory, self.kv.block_bytes

        def swap_s(r: Request) -> float:
            return 2 * memory.blk(r) * bb[r.model] / link_bytes_per_s

        return swap_s
