"""A request's life in the engine: its state, token progress and the timestamps VLT needs.

Pure logic: no torch. Times are seconds (floats) on the engine's clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from shunter.engine import latency
from shunter.engine.config import SloSpec


class RequestState(enum.Enum):
    """Where a request is.

    WAITING: arrived, owns no KV (or lost it to a recompute preemption).
    RUNNING: its KV is on the device and it is in the batch (or joins it next step).
    ROTARY: preempted; its KV lives in host memory until it is swapped back in.
    FINISHED: done (stopped, reached its length, or aborted); owns nothing.
    """

    WAITING = "waiting"
    RUNNING = "running"
    ROTARY = "rotary"
    FINISHED = "finished"


RUNNING, WAITING = RequestState.RUNNING, RequestState.WAITING

# A token id in a plan for a token its request samples in the step still running;
# the engine puts the sampled id in its place before the plan runs.
PLACEHOLDER = -1


@dataclass(eq=False, slots=True)
class Request:
    """One generation request of one model.

    Token accounting follows vLLM: ``num_tokens`` is prompt plus output tokens,
    ``num_computed_tokens`` those whose KV is cached. A step computes the missing ones
    (a prefill chunk, or one token when decoding) and samples a new token when the
    step reaches ``num_tokens``. The request finishes when it has produced
    ``max_output_tokens`` tokens or the executor reports a stop.

    ``t_run`` is when it last started running (for a request swapped back in: the
    step it rejoins the batch), ``t_scheduled`` when it first did (its queue time
    ends), ``t_last`` when it emitted its last token (``None`` before the first),
    ``token_times`` every emission time in order. ``cache_salt`` keeps its prompt's
    cached KV from requests that do not give the same salt (prefix caching).

    ``num_output_placeholders`` counts tokens a planned step samples that are not known
    yet: a plan counts its tokens as computed and its samples as placeholders when it
    is made, so that the next step can be planned while it runs (async scheduling); the
    executor's result turns each placeholder into a token (``record_token``). Until
    then ``token_ids`` gives ``PLACEHOLDER`` in its place.
    """

    id: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    slo: SloSpec
    t_arr: float
    prompt_token_ids: list[int] | None = None
    cache_salt: str | None = None
    prompt_hashes: list[bytes] | None = None  # its prompt's full blocks', once computed
    state: RequestState = RequestState.WAITING
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_output_placeholders: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    t_run: float | None = None
    t_scheduled: float | None = None
    t_last: float | None = None
    t_first_token: float | None = None
    t_finish: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    aborted: bool = False

    def __post_init__(self) -> None:
        if self.prompt_tokens <= 0:
            raise ValueError(f"request {self.id!r}: prompt_tokens must be positive")
        if self.max_output_tokens <= 0:
            raise ValueError(f"request {self.id!r}: max_output_tokens must be positive")
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.prompt_tokens:
            raise ValueError(f"request {self.id!r}: prompt_token_ids disagree with prompt_tokens")

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens, placeholders included: every token whose KV the
        next sample needs."""
        return self.prompt_tokens + self.num_output_tokens + self.num_output_placeholders

    @property
    def max_num_tokens(self) -> int:
        """Prompt plus every output token it may sample: its context at full length."""
        return self.prompt_tokens + self.max_output_tokens

    @property
    def num_sampled(self) -> int:
        """Output tokens sampled or being sampled by a planned step."""
        return self.num_output_tokens + self.num_output_placeholders

    @property
    def has_all_tokens(self) -> bool:
        """Every output token it may have is sampled or being sampled: no step is left
        to plan for it."""
        return self.num_sampled >= self.max_output_tokens

    @property
    def num_pending_tokens(self) -> int:
        """Tokens to compute before the next sample (1 when decoding)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """True until the prompt (or, after a recompute preemption, the context) is cached."""
        return self.num_sampled == 0 or self.num_tokens - self.num_computed_tokens > 1

    @property
    def is_finished(self) -> bool:
        return self.state is RequestState.FINISHED

    def vlt(self, now: float) -> float:
        """Virtual Lag Time (SuperInfer §4.2.2); see ``vlts``."""
        return vlts((self,), now)[0]

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens ``[start, end)`` of the prompt followed by the output so far, with
        ``PLACEHOLDER`` for each output token not known yet."""
        prompt = self.prompt_token_ids
        if prompt is None:
            raise ValueError(f"request {self.id!r} has no prompt token ids")
        n = len(prompt)
        if end <= n:
            return prompt[start:end]
        outputs = self.output_token_ids
        unknown = end - n - len(outputs)
        if unknown > 0:  # only a planned step's samples, at the end
            outputs = outputs + [PLACEHOLDER] * unknown
        if start >= n:
            return outputs[start - n : end - n]
        return prompt[start:] + outputs[: end - n]

    def record_token(self, now: float, token_id: int | None) -> None:
        """Account one emitted token at time ``now`` (the oldest placeholder's, if any)."""
        self.num_output_placeholders = max(0, self.num_output_placeholders - 1)
        self.num_output_tokens += 1
        if token_id is not None:
            self.output_token_ids.append(token_id)
        if self.t_first_token is None:
            self.t_first_token = now
        self.t_last = now
        self.token_times.append(now)

    @property
    def ttft(self) -> float | None:
        return latency.ttft(self.t_arr, self.t_first_token)

    @property
    def tpot(self) -> float | None:
        """(e2e - TTFT) / (output tokens - 1); ``None`` with fewer than two tokens."""
        return latency.tpot(self.t_first_token, self.t_last, self.num_output_tokens)


def vlts(requests: Iterable[Request], now: float, *, paused: bool = False) -> list[float]:
    """Virtual Lag Time (SuperInfer §4.2.2) of each request at ``now``, with S_B = TBT SLO
    and S_F = TTFT SLO:

      RUNNING:  -(now - t_run)
      ROTARY:   alpha * relu(now - t_last - beta_B * S_B)
      WAITING:  relu(now - t_arr - beta_F * S_F)

    A rotary request that has not emitted a token yet lags on its TTFT, not on a token
    gap, so it takes the waiting branch: ``t_last`` does not exist for it. One pass over
    many requests: LVF needs every non-running request's VLT at every contended step.

    ``paused``: the RUNNING requests belong to a model that does not execute (a
    temporal model without the turn). They keep their KV but emit nothing, so they lag
    as rotary ones do.
    """
    out: list[float] = []
    for r in requests:
        slo = r.slo
        if r.state is RUNNING and not paused:
            assert r.t_run is not None
            out.append(-(now - r.t_run))
        elif r.state is not WAITING and r.t_last is not None:
            lag = now - r.t_last - slo.beta_b * slo.tbt_s
            out.append(slo.alpha * lag if lag > 0.0 else 0.0)
        else:
            lag = now - r.t_arr - slo.beta_f * slo.ttft_s
            out.append(lag if lag > 0.0 else 0.0)
    return out


def tbt_slack(r: Request, now: float) -> float:
    """Seconds a running request may pause from ``now`` and still meet its TBT SLO if
    it then emits its next token at once: its SLO is a mean time per output token, so
    after n tokens it may take up to n x TBT since its first one. No token yet: none
    (its TTFT, not a token gap, is at stake)."""
    if r.t_first_token is None or r.num_output_tokens < 1:
        return 0.0
    return r.num_output_tokens * r.slo.tbt_s - (now - r.t_first_token)


def tbt_lost(r: Request, now: float, step_s: float | None) -> bool:
    """Whether a request that has its first token misses its TBT SLO even if it emits
    every token it may still sample from ``now`` on, one per ``step_s``: its SLO is a
    mean over all its tokens, so one behind its pace catches up only by what its
    remaining tokens gain on the target. ``max_output_tokens`` bounds its tokens from
    above; a request that stops sooner had less to gain, so this errs toward "not
    lost"."""
    if r.t_first_token is None or step_s is None:
        return False
    total = r.max_output_tokens
    if total <= 1:
        return False
    left = total - r.num_output_tokens
    return now + left * step_s - r.t_first_token > (total - 1) * r.slo.tbt_s


def slo_lost(r: Request, now: float, step_s: float | None) -> bool:
    """Whether a request can no longer meet both its SLOs whatever is done for it:
    without its first token, past its TTFT target; with it, its first token came late,
    or its TBT target is out of reach at one token per ``step_s`` (``tbt_lost``)."""
    ttft = r.ttft
    if ttft is None:
        return ttft_slack(r, now) <= 0.0
    return ttft > r.slo.ttft_s or tbt_lost(r, now, step_s)


def ttft_slack(r: Request, now: float) -> float:
    """Seconds a request may wait from ``now`` for its first token and still meet its
    TTFT SLO; once it has its first token, none is at stake (infinite)."""
    if r.t_first_token is not None:
        return float("inf")
    return r.t_arr + r.slo.ttft_s - now


def slo_slack(r: Request, now: float) -> float:
    """Seconds a request may wait from ``now`` for its next token and still meet its SLO:
    before its first token its TTFT slack (``ttft_slack``), after it its TBT slack
    (``tbt_slack``). Negative once its next token, coming now, would miss the SLO."""
    return ttft_slack(r, now) if r.t_first_token is None else tbt_slack(r, now)
