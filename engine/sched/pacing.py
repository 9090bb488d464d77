"""Decode pacing: a spatial model whose requests all have time to spare sits out a step
that would otherwise run past a tighter tenant's TBT target.

A step runs each executing model's forward pass one after another, so a step with an
interactive model (TBT 50 ms) and a batch model (TBT 500 ms) lasts both passes, and
every gap between the interactive model's tokens does too. Both SLOs are a mean time
per output token (``request.tbt_slack``): a batch request that has kept ahead of its target
can skip a step and still meet it. Pacing spends that slack on the tight model's gaps,
and on its prompts' first tokens, which come at the end of the step that computes them:
when the estimated step (the sum of the executing models' measured passes) is longer
than the tightest TBT target among the live requests, spatial models that only decode
and whose every request could wait two such steps (its TBT slack) sit this step out,
the one with the most slack first, until the estimate fits. Only decoding models: a
decode pass deferred costs what it would have cost now, while a deferred prompt makes
a later step, which the tight model shares, longer (tried with prompts paced too, in
the simulator's isolation run: the victim's P99 TTFT rose from 131 to 396 ms).
Temporal models are never paced: their turn is their share.

Pure logic: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shunter.engine.request import tbt_slack
from shunter.engine.sched.queues import RequestQueues
from shunter.engine.sched.step_budget import SLACK_STEPS
from shunter.engine.sched.tenancy import Tenancy

# The weight of each new pass in a model's pass-time estimate: about the last five count.
PASS_EWMA_WEIGHT = 0.3


class Pacing:
    """Which executing models run this step; ``observe`` learns each model's pass time
    from the executor's ``StepResult.compute_s``."""

    def __init__(self, queues: Mapping[str, RequestQueues], tenancy: Tenancy) -> None:
        self.queues = queues
        self.tenancy = tenancy
        self.pass_s: dict[str, float] = {}
        self.num_paced = 0  # model-steps sat out

    def observe(self, compute_s: Mapping[str, float]) -> None:
        for model, seconds in compute_s.items():
            if seconds <= 0:
                continue
            old = self.pass_s.get(model)
            self.pass_s[model] = (
                seconds if old is None else old + PASS_EWMA_WEIGHT * (seconds - old)
            )

    def forget(self, model: str) -> None:
        self.pass_s.pop(model, None)

    def select(self, executing: Sequence[str], now: float) -> list[str]:
        """``executing`` less the models that sit this step out. Cheapest checks first:
        this runs every step, and only a step of two or more measured models can be
        paced."""
        busy = [m for m in executing if self.queues[m]]
        if len(busy) < 2 or any(m not in self.pass_s for m in busy):
            return list(executing)
        step = sum(self.pass_s[m] for m in busy)
        tightest = {m: self._tightest(m) for m in busy}
        tight = min(tightest.values())
        if step <= tight:
            return list(executing)
        slack = {m: self._slack(m, now) for m in busy if tightest[m] > tight and self._may_pace(m)}
        paced: set[str] = set()
        for m in sorted(slack, key=lambda m: (-slack[m], m)):
            if step <= tight:
                break
            if slack[m] >= SLACK_STEPS * step:
                paced.add(m)
                step -= self.pass_s[m]
        self.num_paced += len(paced)
        return [m for m in executing if m not in paced]

    def _tightest(self, model: str) -> float:
        """The tightest TBT target among ``model``'s live requests."""
        q = self.queues[model]
        groups = (q.running, q.waiting, q.rotary, q.landing)
        return min(r.slo.tbt_s for g in groups for r in g.values())

    def _may_pace(self, model: str) -> bool:
        """A spatial model all of whose live requests are running decodes: a decode pass
        deferred costs what it would have cost now, while a deferred prompt would only
        make a later step, which the tight model shares, longer."""
        if self.tenancy.tenants[model].sharing != "spatial":
            return False
        q = self.queues[model]
        if q.waiting or q.rotary or q.landing:
            return False
        return all(
            r.t_first_token is not None and r.num_pending_tokens <= 1 for r in q.running.values()
        )

    def _slack(self, model: str, now: float) -> float:
        """The least TBT slack among ``model``'s running requests."""
        return min(
            (tbt_slack(r, now) for r in self.queues[model].running.values()),
            default=float("inf"),
        )
