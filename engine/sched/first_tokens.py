"""First tokens first: the step that computes a short prompt's first token stays short.

With a step budget, a request that arrives while another model works waits for the step
in flight and then for the step that computes its first token. That second step would
last as long as the other models' work in it: their decodes, a chunk of a long prompt,
the first chunks of a fan-out of hundreds of prompts. A model whose admitted prompts all
fit in one step's budget is *light*: its first tokens come at the end of this step. While
a light model is admitted, the other models' work that has time to spare sits the step
out: decodes whose TBT slack covers two steps (``lvf.tbt_slack``), and prompts, running
or waiting, whose TTFT slack covers two steps and the steps their own tokens take
(``lvf.ttft_slack``). Work without that slack runs as before, so every request still
meets what its SLO asks; a heavy model loses one step per light admission. Shortest
first among first tokens: a light prompt goes ahead of the chunks of heavy ones, which
could not finish in this step anyway.

Pure logic: no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shunter.engine.request import Request, RequestState
from shunter.engine.sched.lvf import tbt_slack, ttft_slack
from shunter.engine.sched.step_budget import SLACK_STEPS

WAITING, ROTARY = RequestState.WAITING, RequestState.ROTARY


@dataclass(frozen=True)
class FirstTokens:
    """This step's light models (none: nothing sits out), at time ``now``, with the
    step's token budget and its target ``step_s``: a request of another model sits the
    step out if it could wait ``SLACK_STEPS`` steps and still meet its target."""

    light: frozenset[str]
    budget_tokens: int
    step_s: float
    now: float

    @classmethod
    def of(
        cls,
        admit: Sequence[Request],
        budget_tokens: int,
        step_s: float,
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
        return cls(light, budget_tokens, step_s, now)

    @property
    def wait_s(self) -> float:
        return SLACK_STEPS * self.step_s

    def sits_out(self, model: str) -> bool:
        """Whether ``model``'s work with slack sits this step out."""
        return bool(self.light) and model not in self.light

    def decodes(self, decodes: list[Request]) -> list[Request]:
        """``decodes`` less those of the other models that can wait a step."""
        if not self.light:
            return decodes
        return [r for r in decodes if r.model in self.light or tbt_slack(r, self.now) < self.wait_s]

    def prompts(self, prompts: list[Request]) -> list[Request]:
        """``prompts`` (running or waiting; rotary ones still swap in, since their copies
        overlap the step and add no compute) less those that can wait a step."""
        if not self.light:
            return prompts
        return [r for r in prompts if r.state is ROTARY or not self.prompt_waits(r)]

    def prompt_waits(self, r: Request) -> bool:
        """Whether ``r``'s prompt sits this step out: its TTFT slack covers the wait
        and then the steps its pending tokens take at the full budget, so a flood of
        light requests cannot push a long prompt past its target."""
        if not self.sits_out(r.model):
            return False
        steps = -(-r.num_pending_tokens // self.budget_tokens)
        return ttft_slack(r, self.now) >= self.wait_s + steps * self.step_s
