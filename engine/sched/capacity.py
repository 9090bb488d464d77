"""KV capacity between models: what each model lacked in a step, and who gives it back.

A step's ``short`` maps a model to the KV bytes it lacked: the victims' blocks of the
decodes that found none (``decodes``), the admissions that did not fit (``admission``),
and, for a model that lacked nothing else, the head of its queues that does not fit
(``add_starved``): an executing model's, or one below its KV floor with work that waits
for its turn. At the end of the step, ``reclaim`` moves capacity to them: the other
model with the most free blocks gives chunks back, or compacts.

A KV floor its model cannot use is lent (``lend_floors``): when every head of a model's
queues needs more than its free blocks and its whole unheld floor, but no more than its
own memory and that floor, it waits for its own running requests to finish, and what
they free serves it, not the floor. Kept idle, that
floor made the other models queue beside it (SIMULATED, ``bench isolation --on sim
--scenario c2``: OPT-30B's 1,469-token prompts needed 2.0 GB, its unheld floor was 0.32
GB, and the victim's 443-token prompt waited 7.3 s for memory its own 1.03 GB floor no
longer had). A floor is recalled as soon as it would make a head fit, and when that head
lags, what it lacks is given back at the next step (``repay``): the models beyond their
floor are preempted for it, as a decode out of blocks preempts, but never below their
own floor.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from operator import attrgetter

from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.plan import StepPlan
from shunter.engine.request import Request, vlts
from shunter.engine.sched.preemption import Preemptor
from shunter.engine.sched.pressure import KvBytes
from shunter.engine.sched.queues import RequestQueues
from shunter.engine.sched.tenancy import Urgency


class Capacity:
    """Shortfalls and reclaim over the memory and the per-model queues of ``kv``, in
    bytes; ``preemptor`` preempts what a floor recalled is owed."""

    def __init__(self, kv: KvBytes, preemptor: Preemptor) -> None:
        self.memory: KVMemory = kv.memory
        self.queues: Mapping[str, RequestQueues] = kv.queues
        self.kv = kv
        self.preemptor = preemptor
        self.num_repayments = 0  # requests preempted to give lent floors back

    def _heads(self, model: str) -> list[Request]:
        """The heads of the model's queues (``starved``): the first waiting request, the
        first rotary one in preemption order and the earliest rotary arrival."""
        q = self.queues[model]
        heads = list(itertools.islice(q.waiting.values(), 1))
        if q.rotary:
            heads.append(next(iter(q.rotary.values())))
            heads.append(min(q.rotary.values(), key=attrgetter("t_arr")))
        return heads

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
        free = self.memory.num_free_blocks(model)
        lacks = [self.lack(r) for r in self._heads(model) if self.memory.blk(r) > free]
        return max(lacks, default=0)

    def lend_floors(self) -> None:
        """Lend the part of each floor stranded now (module docstring): a model whose
        every queue head needs more than it may take now (its free blocks, and its
        unheld floor were it kept) and no more than its held blocks and its unheld floor
        (what its own running requests leave it once they finish) lends that unheld
        floor less what its running requests may still grow into (their blocks at full
        length beyond those they hold). A model whose head fits, or with no head (idle,
        or only running), lends nothing: its next request finds its floor. Nor does one
        with a head that needs more than its own memory and floor: that head needs the
        floor and more besides."""
        memory, bb = self.memory, self.kv.block_bytes
        lent: dict[str, int] = {}
        for m in memory.bounds.floors:
            unheld = memory.unheld_floor_bytes(m)
            heads = self._heads(m)
            if not unheld or not heads:
                continue
            fits = max(memory.num_free_blocks(m), self._with_floor(m))
            own = memory.num_held_blocks(m) + memory.unheld_floor_blocks(m)
            if all(fits < memory.blk(r) <= own for r in heads):
                running = self.queues[m].running.values()
                full = sum(memory.num_blocks(r.max_num_tokens) for r in running)
                lent[m] = unheld - (full - sum(memory.blks(running))) * bb[m]
        memory.lend_floors(lent)

    def _with_floor(self, model: str) -> int:
        """Blocks the model could place with its unheld floor kept: its free blocks and
        that floor."""
        memory = self.memory
        return memory.num_held_free_blocks(model) + memory.unheld_floor_blocks(model)

    def owed(self, now: float) -> int:
        """KV bytes the lagging heads (VLT > 0) that their model's unheld floor would
        make fit lack beyond the free blocks they may take now: what ``repay`` preempts
        for. A head within its tolerance meets its SLO waiting for the borrowers to free
        the floor, as lvf+ rotates nobody out for it, and so does a floor recalled with
        no head waiting for it."""
        memory, bb = self.memory, self.kv.block_bytes
        owed = 0
        for m in memory.bounds.floors:
            heads = self._heads(m)
            if not heads or not memory.unheld_floor_bytes(m):
                continue
            free, floor = memory.num_free_blocks(m), self._with_floor(m)
            fitting = [r for r in heads if free < memory.blk(r) <= floor]
            lags = vlts(fitting, now)
            lagging = [r for r, lag in zip(fitting, lags, strict=True) if lag > 0.0]
            if lagging:
                owed += (max(map(memory.blk, lagging)) - free) * bb[m]
        return owed

    def repay(self, plan: StepPlan, now: float) -> None:
        """Give back what the models beyond their floor hold of the floors recalled
        (``KVMemory.floor_debt``), up to what the heads waiting for them lack
        (``owed``), less what the free blocks beyond those models' floors and their
        copies in flight already give: their running requests are preempted, the most
        indebted model's first, each as a decode out of blocks picks it
        (``Preemptor.pick``) among those that leave the model its floor. ``reclaim``
        then returns the pages."""
        memory = self.memory
        debt = memory.floor_debt()
        if debt:
            debt = min(debt, self.owed(now))
        if not debt:
            return
        bb = self.kv.block_bytes
        beyond = {m: memory.beyond_floor_bytes(m) for m in self.queues}
        borrowers = sorted((m for m, n in beyond.items() if n > 0), key=beyond.__getitem__)
        borrowers.reverse()  # the most indebted first
        for m in borrowers:
            debt -= memory.spare_bytes(m) + memory.num_incoming_blocks(m) * bb[m]
        for m in borrowers:
            q, owes = self.queues[m], beyond[m] - memory.spare_bytes(m)
            running = list(q.running.values())
            held = dict(zip(running, self.kv.of(running), strict=True))
            while debt > 0:
                # Within what the model holds beyond its floor: a request its floor
                # keeps is not preempted for another model's.
                fitting = [r for r, n in held.items() if n <= owes]
                if not fitting:
                    break
                r = self.preemptor.pick(fitting, now)
                self.preemptor.preempt(r, plan, q)
                self.num_repayments += 1
                nbytes = held.pop(r)
                debt, owes = debt - nbytes, owes - nbytes

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
        again, so a model without one is counted only when it executes. Where the
        policy rotates, a temporal model's floor does not hold while another holds the
        turn (``KVMemory.suspend_floors``), so it is owed nothing until its turn.
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
        frames being restored: the other model with the most free blocks compacts (one donor
        a step for them, besides the recalled floors' own: moves cost copies). A model that
        executed gives back what they lack and no more: it would claim the rest again,
        chunks thrashing between pools every step. One that did not gives back every empty
        chunk, so that the free pages, not rotation, serve the next steps' admissions. When
        every model holding free blocks is short itself, the most urgent one (``urgency``,
        as for turns) is served and the others give back to it, or no one would ever get
        enough. Before all that, what the floors recalled are owed (``KVMemory.floor_debt``)
        comes back from the model with the most free blocks beyond its floor."""
        memory = self.memory
        # Floors recalled first: the model holding the most free blocks beyond its floor
        # gives them back, short itself or not (``repay`` preempted for them).
        debt = memory.floor_debt()
        if debt and (payers := [m for m in self.queues if memory.spare_bytes(m)]):
            memory.compact(max(payers, key=memory.spare_bytes), debt)
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
