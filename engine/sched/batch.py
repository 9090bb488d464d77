"""A step's batch entries: one token per decode, a chunk per prefill, within a budget."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shunter.engine.plan import BatchEntry, StepPlan
from shunter.engine.request import Request, RequestState, tbt_slack

RUNNING = RequestState.RUNNING

# tuple.__new__ builds a BatchEntry in C at half the cost of its Python __new__: a step
# makes one per running request.
_entry = tuple.__new__


def add_decodes(plan: StepPlan, decodes: Iterable[Request], tokens: int) -> int:
    """Add one token for each of ``decodes`` still RUNNING (the policy may have
    preempted some since their blocks were reserved) to ``plan.batch``, in order,
    within ``tokens``; return the tokens left."""
    for r in decodes:
        if tokens <= 0:
            break
        if r.state is RUNNING:
            plan.batch.append(
                _entry(BatchEntry, (r.id, r.model, 1, r.num_computed_tokens, False, True))
            )
            tokens -= 1
    return tokens


def least_slack(decodes: Sequence[Request], limit: int, now: float) -> Sequence[Request]:
    """``decodes`` cut to the ``limit`` whose TBT slack (``request.tbt_slack``) is least, in
    their order: a request left out gains nothing and loses slack while it waits, so
    it comes first a step or two later (a round robin paced by each request's own TBT
    target: a tight request is skipped less)."""
    if len(decodes) <= limit:
        return decodes
    keep = set(sorted(range(len(decodes)), key=lambda i: tbt_slack(decodes[i], now))[:limit])
    return [r for i, r in enumerate(decodes) if i in keep]


def add_chunk(plan: StepPlan, r: Request, tokens: int) -> int:
    """Add the next prefill chunk of ``r``, at most ``tokens`` (> 0) of its pending
    tokens, to ``plan.batch``; it samples when it takes them all. Return its length."""
    pending = r.num_pending_tokens
    n = min(pending, tokens)
    entry = (r.id, r.model, n, r.num_computed_tokens, True, n == pending)
    plan.batch.append(_entry(BatchEntry, entry))
    return n
