"""KV in bytes across models: what requests cost, what is free, and a step's pressure.

Models' blocks differ in size, so decisions that span models (LVF's one order, the
remapping controller) count bytes. These are the scheduler's answers in that unit.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from operator import attrgetter

from shunter.engine.config import SchedulerConfig
from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.remap.controller import Pressure
from shunter.engine.request import Request, vlts
from shunter.engine.sched.lvf import num_slots_freed
from shunter.engine.sched.queues import RequestQueues
from shunter.engine.sched.room import Room, one_sum


class KvBytes:
    """Byte counts over ``memory`` and the per-model ``queues``."""

    def __init__(
        self, memory: KVMemory, queues: Mapping[str, RequestQueues], config: SchedulerConfig
    ) -> None:
        self.memory = memory
        self.queues = queues
        self.config = config
        self.block_bytes = {m: memory.block_bytes(m) for m in queues}

    def of(self, requests: Sequence[Request]) -> list[int]:
        """Bytes each request holds on the device (RUNNING) or needs there."""
        return self.memory.blks_bytes(requests)

    def free(self, models: Sequence[str]) -> int:
        """Bytes ``models`` may allocate now: their pools' free blocks and the largest
        claim one of them could make (claims are shared)."""
        return one_sum(*self._held_and_claims(models))

    def room(self, executing: Sequence[str]) -> Room:
        """The executing models' free KV pool by pool (``free`` counts it as one sum:
        ``Room.total``)."""
        memory = self.memory
        held, claims = self._held_and_claims(executing)
        kept = {m: memory.kept_floor_bytes(m) for m in self.queues}
        return Room(
            held=held,
            claims=claims,
            kept={m: kept[m] for m in executing},
            shared_pages=max(0, memory.free_page_bytes - sum(kept.values())),
            spare={m: memory.spare_bytes(m) for m in executing},
            movable=frozenset(m for m in self.queues if memory.above_floor(m)),
        )

    def _held_and_claims(self, models: Sequence[str]) -> tuple[dict[str, int], dict[str, int]]:
        """Per model, the free bytes its pool holds and those of the free pages it may
        claim now."""
        memory, bb = self.memory, self.block_bytes
        held = {m: memory.num_held_free_blocks(m) * bb[m] for m in models}
        claims = {m: memory.num_free_blocks(m) * bb[m] - held[m] for m in models}
        return held, claims

    def pressure(
        self,
        executing: Sequence[str],
        sitting_out: set[str],
        *,
        now: float,
        num_running: int,
        rotates: bool,
    ) -> Pressure:
        """What the executing models need this step (a block for each decode that starts
        one, and the blocks of the waiting and rotary requests the running slots could
        admit, earliest arrivals first) against the free KV: what they may allocate now
        plus the free blocks other models hold, which compaction moves to them (free
        pages come first in every capacity order). With ``rotates`` (LVF, with rotation
        in the capacity order), rotation may free the KV of running requests whose
        memory they can use, within B_xfer, and the slots are the free ones plus those
        LVF's slot rule frees (``lvf.num_slots_freed``)."""
        memory, bb, bt = self.memory, self.block_bytes, self.memory.block_tokens
        slots = max(0, self.config.max_running - num_running)
        demand = 0
        candidates: list[Request] = []
        for m in executing:
            q = self.queues[m]
            growth = sum(
                1
                for r in q.running.values()
                if r.num_computed_tokens % bt == 0 and r.id not in sitting_out
            )
            demand += growth * bb[m]
            candidates += q.waiting.values()
            candidates += q.rotary.values()
        if len(candidates) > slots:
            if rotates and self.config.xfer_budget_blocks > 0:
                running = (
                    r
                    for m, q in self.queues.items()
                    if m in executing or memory.above_floor(m)
                    for r in q.running.values()
                )  # what LVF may preempt, as the Scheduler gives it
                slots += num_slots_freed(vlts(candidates, now), running, now)
            candidates = heapq.nsmallest(slots, candidates, key=attrgetter("t_arr"))
        demand += sum(self.of(candidates))
        rotation = 0
        if rotates and executing:
            used = memory.blocks_used()
            movable = sum(
                used[m] * bb[m] for m in self.queues if m in executing or memory.above_floor(m)
            )
            budget = self.config.xfer_budget_blocks * max(bb[m] for m in executing)
            rotation = min(budget, movable)
        others = sum(
            memory.num_held_free_blocks(m) * bb[m] for m in self.queues if m not in executing
        )
        # With nothing executing, the free pages all count (whoever comes next claims them).
        free = others + (self.free(executing) if executing else memory.free_page_bytes)
        return Pressure(demand=demand, free=free, rotation=rotation)
