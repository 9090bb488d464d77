"""KV capacity between models: what each model lacked in a step, and who gives it back.

A step's ``short`` maps a model to the KV bytes it lacked: the victims' blocks of the
decodes that found none (``decodes``), the admissions that did not fit (``admission``),
and, for a model that lacked nothing else, the head of its queues that does not fit
(``add_starved``): an executing model's, or one below its KV floor with work that waits
for its turn. At the end of the step, ``reclaim`` moves capacity to them: the other
model with the most free blocks gives chunks back, or compacts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter

from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.request import Request
from shunter.engine.sched.pressure import KvBytes
from shunter.engine.sched.queues import RequestQueues
from shunter.engine.sched.tenancy import Urgency


class Capacity:
    """Shortfalls and reclaim over ``memory`` and the per-model ``queues``, in bytes."""

    def __init__(self, memory: KVMemory, queues: Mapping[str, RequestQueues], kv: KvBytes) -> None:
        self.memory = memory
        self.queues = queues
        self.kv = kv

    def lack(self, r: Request) -> int:
        """KV bytes ``r``'s model lacks to bring it onto the device (one block at least:
        it did not fit)."""
        memory = self.memory
        missing = max(1, memory.blk(r) - memory.num_free_blocks(r.model))
        return missing * self.kv.block_bytes[r.model]

    def starved(self, model: str) -> int:
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
        lacks = [self.lack(r) for r in heads if r is not None and self.memory.blk(r) > free]
        return max(lacks, default=0)

    def add_starved(self, executing: Sequence[str], short: dict[str, int]) -> None:
        """Each executing model not yet ``short`` is short of what it is ``starved`` of,
        if anything, and so is each model with work below its KV floor.

        A temporal model that waits for its turn is owed its floor meanwhile: counted
        short only in the steps it executed, it was given one chunk's compaction each
        time the turn came to it, and when its head did not fit it passed the turn on at
        once (``Tenancy.pass_turn``), so its memory came back one step a quantum (c1
        temporal, 4 req/s, seeds 2 and 3, with remapping: Llama-3-8B's burst waited 5.2
        s and 9.8 s against a 5 s TTFT target while Llama-2-13B held 4.8-5 GB of free
        blocks beyond its floor). The pages given back for it stay its own (its floor
        keeps them); without a floor they would not, and the holder would claim them
        again, so a model without one is counted only when it executes.
        """
        owed = [
            m
            for m, q in self.queues.items()
            if q and m not in executing and self.memory.unheld_floor_bytes(m)
        ]
        for m in [*executing, *owed]:
            if m not in short:
                lack = self.starved(m)
                if lack:
                    short[m] = lack

    def reclaim(
        self,
        short: Mapping[str, int],
        executing: Sequence[str],
        urgency: Urgency,
        vacating_bytes: int,
    ) -> None:
        """Move capacity to the models that ran ``short`` and to ``vacating_bytes`` of
        frames being restored: the other model with the most free blocks compacts (one
        a step: moves cost copies). A model that executed gives back what they lack and
        no more: it would claim the rest again, chunks thrashing between pools every
        step. One that did not gives back every empty chunk, so that the free pages, not
        rotation, serve the next steps' admissions. When every model holding free blocks
        is short itself, the most urgent one (``urgency``, as for turns) is served
        and the others give back to it, or no one would ever get enough."""
        memory = self.memory
        need = sum(short.values())
        others = [m for m in self.queues if m not in short]
        if len(short) > 1 and not any(map(memory.num_held_free_blocks, others)):
            first = max(short, key=urgency)
            need = short[first]
            others = [m for m in short if m != first]
        need += vacating_bytes
        if need and others:
            donor = max(others, key=memory.num_held_free_blocks)
            memory.compact(donor, need if donor in executing else None)
