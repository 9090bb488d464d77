"""First tokens first: the step that computes a short prompt's first token stays short.

With a step budget, a request that arrives while another model works waits for the step
in flight and then for the steps that compute its first token. Those would last as long
as the other models' work in them: their decodes, a chunk of a long prompt, the first
chunks of a fan-out of hundreds of prompts. The prompts whose first token is pending
(admitted this step, or running chunks of a prompt) of the tightest TTFT class among
them decide who goes first. Their models are *light* when those prompts fit in one
step's budget (their first tokens come at the end of this step), and also, whatever
their length, when some of the step's other work is of a looser class (an interactive
tenant's prompt goes ahead of a batch tenant's work over every step it takes). While a
model is light, the work of the other models that is not of a tighter class and has
time to spare sits the step out: decodes whose TBT slack covers two steps
(``request.tbt_slack``), and prompts, running or waiting, whose TTFT slack covers two steps
and the steps their own tokens take (``request.ttft_slack``). Work without that slack runs
as before, so every request still meets what its SLO asks; a heavy model loses one step
per light step. Shortest first among first tokens of one class: a light prompt goes
ahead of the chunks of heavy ones, which could not finish in this step anyway.

Pure logic: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain

from shunter.engine.request import Request, RequestState, tbt_slack, ttft_slack
from shunter.engine.sched.step_budget import SLACK_STEPS

WAITING, ROTARY, RUNNING = RequestState.WAITING, RequestState.ROTARY, RequestState.RUNNING


@dataclass(frozen=True)
class FirstTokens:
    """This step's light models (none: nothing sits out), the TTFT target of the class
    their first tokens are of (``ttft_s``), at time ``now``, with the step's token budget
    and its target ``step_s``: a request of another model that is not of a tighter class
    sits the step out if it could wait ``SLACK_STEPS`` steps and still meet its target."""

    light: frozenset[str]
    budget_tokens: int
    step_s: float
    now: float
    ttft_s: float = math.inf

    @classmethod
    def of(
        cls,
        admit: Sequence[Request],
        budget_tokens: int,
        step_s: float,
        now: float,
        fits: Callable[[Request], bool],
        *,
        prefills: Sequence[Request] = (),
        decodes: Sequence[Request] = (),
    ) -> FirstTokens:
        """The light models. First tokens are pending for the waiting requests among
        ``admit`` (each must ``fits`` in its model's memory now, else its model is not
        light: work sits out only for a first token that this step computes) and the
        running ``prefills`` without one; those still within their TTFT target decide.
        Where any of the step's work (``admit``, ``prefills``, ``decodes``) is of a
        looser TTFT class than the tightest of them, the models with first tokens of
        that class pending are light, whatever their length. Otherwise (one class) the
        models whose admitted prompts bring at most ``budget_tokens`` tokens in all are."""
        waiting = [r for r in admit if r.state is WAITING]
        unfit = {r.model for r in waiting if not fits(r)}
        running = [r for r in prefills if r.state is RUNNING and _first_pending(r)]
        on_time = [r for r in chain(waiting, running) if ttft_slack(r, now) > 0.0]
        if on_time:
            tightest = min(r.slo.ttft_s for r in on_time)
            if any(r.slo.ttft_s > tightest for r in chain(admit, prefills, decodes)):
                light = {r.model for r in on_time if r.slo.ttft_s <= tightest} - unfit
                return cls(frozenset(light), budget_tokens, step_s, now, tightest)
        else:
            tightest = min((r.slo.ttft_s for r in waiting), default=math.inf)
        demand: dict[str, int] = {}
        for r in waiting:
            demand[r.model] = demand.get(r.model, 0) + r.num_pending_tokens
        light = {m for m, tokens in demand.items() if tokens <= budget_tokens} - unfit
        return cls(frozenset(light), budget_tokens, step_s, now, tightest)

    @property
    def wait_s(self) -> float:
        return SLACK_STEPS * self.step_s

    def sits_out(self, r: Request) -> bool:
        """Whether ``r`` is work that sits this step out if it has the slack: of another
        model than the light ones, and not of a tighter class than the first tokens that
        decide (a light step for a class of its own)."""
        return bool(self.light) and r.model not in self.light and r.slo.ttft_s >= self.ttft_s

    def decodes(self, decodes: list[Request]) -> list[Request]:
        """``decodes`` less those of the other models that can wait a step."""
        if not self.light:
            return decodes
        return [r for r in decodes if not self.sits_out(r) or tbt_slack(r, self.now) < self.wait_s]

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
        if not self.sits_out(r):
            return False
        steps = -(-r.num_pending_tokens // self.budget_tokens)
        return ttft_slack(r, self.now) >= self.wait_s + steps * self.step_s


def _first_pending(r: Request) -> bool:
    """Whether a running request's prompt has yet to give its first token: none
    recorded, none sampled by a plan in flight."""
    return r.t_first_token is None and r.num_output_placeholders == 0
