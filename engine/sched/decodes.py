"""Decode first: a block for every decoding request's next token, before any decision.

Decodes are served before the policy decides and before any prefill, under every
policy alike. Out of blocks, a decode waits for blocks already on their way, or else a
running request of its model is preempted (passive preemption): the one the policy
names (``Policy.passive_victim``; vLLM's rule, the latest arrival, by default).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.plan import StepPlan
from shunter.engine.request import Request, RequestState
from shunter.engine.sched.preemption import Preemptor
from shunter.engine.sched.pressure import KvBytes
from shunter.engine.sched.queues import RequestQueues

RUNNING = RequestState.RUNNING


class Decodes:
    """Reserves the blocks of a step's decodes (``batch.add_decodes`` batches them).

    ``num_passive_preemptions`` counts the preemptions decodes forced; every other
    preemption is the policy's choice. ``preemptor`` picks the request a decode out of
    blocks preempts among its model's running ones, and rotates it out or drops it to
    recompute.
    """

    def __init__(
        self,
        memory: KVMemory,
        queues: Mapping[str, RequestQueues],
        kv: KvBytes,
        preemptor: Preemptor,
    ) -> None:
        self.memory = memory
        self.queues = queues
        self.kv = kv
        self.preemptor = preemptor
        self.num_passive_preemptions = 0

    def reserve(
        self,
        executing: Iterable[str],
        plan: StepPlan,
        sitting_out: set[str],
        short: dict[str, int],
        now: float,
    ) -> tuple[list[Request], list[Request]]:
        """Blocks for the next token of each decoding request of the ``executing``
        models, model by model, oldest request first.

        Returns the decoding requests that got a block and the running requests still
        in prefill, in running order, leaving out those whose swap-in copies are in
        flight (``sitting_out``). Out of blocks, a request waits for blocks already on
        their way (released by a preemption whose copies are in flight); if none are,
        ``preemptor`` picks a running request of its model at ``now`` to preempt, possibly
        the request itself, and its model is ``short`` of the victim's KV bytes (added
        to what ``short`` holds).
        """
        decodes: list[Request] = []
        prefills: list[Request] = []
        for model in executing:
            self._reserve(model, plan, sitting_out, short, decodes, prefills, now)
        return decodes, prefills

    def _reserve(
        self,
        model: str,
        plan: StepPlan,
        sitting_out: set[str],
        short: dict[str, int],
        decodes: list[Request],
        prefills: list[Request],
        now: float,
    ) -> None:
        q = self.queues[model]
        memory = self.memory
        decoding: list[Request] = []
        for r in q.running.values():
            if r.id in sitting_out:
                continue
            # ``r.is_prefill`` inlined: this loop visits every running request each step.
            sampled = r.num_output_tokens + r.num_output_placeholders
            pending = r.prompt_tokens + sampled - r.num_computed_tokens
            if sampled == 0 or pending > 1:
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
                victim = self.preemptor.pick(q.running.values(), now)
                short[model] = short.get(model, 0) + self.kv.of((victim,))[0]
                self.preemptor.preempt(victim, plan, q)
                self.num_passive_preemptions += 1
                incoming = memory.num_incoming_blocks(model)
                if victim is r:
                    break
            else:
                memory.append(r, 1)
                decodes.append(r)
