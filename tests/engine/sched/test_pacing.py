"""Decode pacing: which executing models sit a step out, on hand-built queues."""

from __future__ import annotations

from shunter.engine.config import SloSpec, TenantSpec
from shunter.engine.request import Request, RequestState
from shunter.engine.sched.pacing import Pacing
from shunter.engine.sched.queues import RequestQueues
from shunter.engine.sched.tenancy import Tenancy

CHAT = SloSpec("interactive", ttft_s=1.0, tbt_s=0.05)
BATCH = SloSpec("batch", ttft_s=60.0, tbt_s=0.5)
NOW = 100.0


def decoding(rid: str, model: str, slo: SloSpec, *, tokens: int, since: float) -> Request:
    """A running request with ``tokens`` output tokens, the first at ``NOW - since``."""
    r = Request(rid, model, 16, 256, slo, t_arr=NOW - since - 0.1)
    r.num_computed_tokens, r.num_output_tokens = 16 + tokens - 1, tokens
    r.t_first_token, r.t_run = NOW - since, NOW - since
    return r


def pacing(*specs: TenantSpec, requests: list[Request]) -> Pacing:
    queues = {t.model: RequestQueues() for t in specs}
    for r in requests:
        state = r.state
        queues[r.model].waiting[r.id] = r
        r.state = RequestState.WAITING
        if state is not RequestState.WAITING:
            queues[r.model].move(r, state)
    return Pacing(queues, Tenancy(specs, min_quantum_s=0.5))


SPATIAL = (TenantSpec("chat", slo=CHAT), TenantSpec("batch", slo=BATCH))


def running(r: Request) -> Request:
    r.state = RequestState.RUNNING
    return r


def chat_and_batch(*more: Request) -> list[Request]:
    """A chat request in decode, and a batch one 18 s ahead of its TBT target (40 tokens
    in 2 s against 0.5 s each)."""
    return [
        running(decoding("c", "chat", CHAT, tokens=3, since=0.1)),
        running(decoding("b", "batch", BATCH, tokens=40, since=2.0)),
        *more,
    ]


def test_a_batch_model_with_slack_sits_out_a_step_longer_than_chats_tbt() -> None:
    # 40 tokens in 2 s: 18 s of TBT slack against two 60 ms steps.
    p = pacing(*SPATIAL, requests=chat_and_batch())
    p.observe({"chat": 0.02, "batch": 0.04})
    assert p.select(["chat", "batch"], NOW) == ["chat"]
    assert p.num_paced == 1


def test_no_model_sits_out_a_step_that_fits_the_tightest_tbt() -> None:
    p = pacing(*SPATIAL, requests=chat_and_batch())
    p.observe({"chat": 0.02, "batch": 0.02})
    assert p.select(["chat", "batch"], NOW) == ["chat", "batch"]


def test_a_model_behind_its_own_target_or_with_a_prompt_to_compute_runs() -> None:
    behind = running(decoding("b", "batch", BATCH, tokens=4, since=2.0))  # slack 0 s
    p = pacing(
        *SPATIAL, requests=[running(decoding("c", "chat", CHAT, tokens=3, since=0.1)), behind]
    )
    p.observe({"chat": 0.02, "batch": 0.04})
    assert p.select(["chat", "batch"], NOW) == ["chat", "batch"]
    # Slack to spare on its decode, but a prompt waiting: deferred, it would only make
    # a later step longer.
    due = Request("w", "batch", 16, 8, BATCH, t_arr=NOW - 1.0)
    p = pacing(*SPATIAL, requests=chat_and_batch(due))
    p.observe({"chat": 0.02, "batch": 0.04})
    assert p.select(["chat", "batch"], NOW) == ["chat", "batch"]


def test_the_model_with_the_tightest_target_and_temporal_models_always_run() -> None:
    temporal = (TenantSpec("chat", slo=CHAT), TenantSpec("batch", sharing="temporal", slo=BATCH))
    p = pacing(*temporal, requests=chat_and_batch())
    p.observe({"chat": 0.04, "batch": 0.04})
    assert p.select(["chat", "batch"], NOW) == ["chat", "batch"]
    # Alone with slack, a model is never paced: nothing tighter is in decode beside it.
    p = pacing(*SPATIAL, requests=[running(decoding("b", "batch", BATCH, tokens=40, since=2.0))])
    p.observe({"batch": 0.9})
    assert p.select(["batch"], NOW) == ["batch"]


def test_an_unmeasured_model_is_not_paced() -> None:
    p = pacing(*SPATIAL, requests=chat_and_batch())
    p.observe({"chat": 0.06})
    assert p.select(["chat", "batch"], NOW) == ["chat", "batch"]
