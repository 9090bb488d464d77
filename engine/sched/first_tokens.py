"""First tokens first: the step that computes a short prompt's first token stays short.

With a step budget, a request that arrives while another model works waits for the step
in flight and then for the step that computes its first token. That second step would
last as long as the other models' work in it: their decodes, a chunk of a long prompt,
the first chunks of a fan-out of hundreds of prompts. A model whose admitted prompts all
fit in one step's budget is *light*: its first tokens come at the end of this step. While
a light model is admitted, the other models' work that has time to spare sits the step
out: decodes whose TBT slack covers ``wait_s`` (``lvf.tbt_slack``), and prompts, running
or waiting, whose TTFT slack does (``lvf.ttft_slack``). Work without that slack runs as
before, so every request still meets what its SLO asks; a heavy model loses one step per
light admission. Shortest first among first tokens: a light prompt goes ahead of the
chunks of heavy ones, which could not finish in this step anyway.

Pure logic: no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shunter.engine.request import Request, RequestState
from shunter.engine.sched.lvf import tbt_slack, ttft_slack

WAITING = RequestState.WAITING


@dataclass(frozen=True)
class FirstTokens:
    """This step's light models (none: nothing sits out) and the slack ``wait_s`` a
    request of another model needs to sit the step out, at time ``now``."""

    light: frozenset[str]
    wait_s: float
    now: float

    @classmethod
    def of(
        cls,
        admit: Sequence[Request],
        budget_tokens: int,
        wait_s: float,
        now: float,
        fits: Callable[[Request], bool],
    ) -> FirstTokens:
        """The models whose waiting requests among ``admit`` bring at most
        ``budget_tokens`` prompt tokens in all, each of which ``fits`` in its model's
        memory now: work sits out only for a first token that this step computes."""
        demand: dict[str, int] = {}
        unfit: set[str] = set()
        for r in admit:
            if r.state is WAITING:
                demand[r.model] = demand.get(r.model, 0) + r.num_pending_tokens
                if not fits(r):
                    unfit.add(r.model)
        light = frozenset(
            m for m, tokens in demand.items() if tokens <= budget_tokens and m not in unfit
        )
        return cls(light, wait_s, now)

    def sits_out(self, model: str) -> bool:
        """Whether ``model``'s work with slack sits this step out."""
        return bool(self.light) and model not in self.light

    def decodes(self, decodes: Sequence[Request]) -> list[Request]:
        """``decodes`` less those of the other models that can wait a step."""
        if not self.light:
            return list(decodes)
        return [r for r in decodes if r.model in self.light or tbt_slack(r, self.now) < self.wait_s]

    def admissions(self, admit: Sequence[Request]) -> list[Request]:
        """``admit`` less the other models' waiting requests that can wait (rotary
        ones still swap in: their copies overlap the step and add no compute)."""
        if not self.light:
            return list(admit)
        return [r for r in admit if not (r.state is WAITING and self.prompt_waits(r))]

    def prompt_waits(self, r: Request) -> bool:
        """Whether ``r``'s prompt (running or waiting) sits this step out."""
        return self.sits_out(r.model) and ttft_slack(r, self.now) >= self.wait_s
