"""First tokens first: while a light model's request is admitted, the other models'
work that can wait a step (decodes by TBT slack, prompts by TTFT slack) sits it out."""

from __future__ import annotations

import dataclasses

from shunter.engine.config import SloSpec
from shunter.engine.core import EngineCore
from shunter.engine.request import Request, RequestState
from shunter.engine.sched.first_tokens import FirstTokens
from tests.engine.fakes import TINY, make_core, request, tiny_config
from tests.engine.sched.helpers import timed_linearly

OTHER = dataclasses.replace(TINY, name="other")
NO_SLACK = SloSpec("no-slack", ttft_s=0.001, tbt_s=0.001)


def fits_anywhere(_: Request) -> bool:
    return True


def _state(
    r: Request, state: RequestState, *, tokens: int = 0, t_first: float | None = None
) -> Request:
    r.state = state
    if t_first is not None:
        r.record_token(t_first, 7)
        for _ in range(tokens - 1):
            r.record_token(t_first, 7)
    return r


def test_only_models_whose_admitted_prompts_fit_one_step_are_light() -> None:
    quick = _state(request("q", 4, 8, model="other"), RequestState.WAITING)
    fan = [_state(request(f"f{i}", 16, 8), RequestState.WAITING) for i in range(8)]
    first = FirstTokens.of(
        [*fan, quick], budget_tokens=64, step_s=0.05, now=1.0, fits=fits_anywhere
    )
    assert first.light == {"other"}  # 128 tokens of 16-token prompts do not fit in 64
    assert first.sits_out(fan[0]) and not first.sits_out(quick)
    assert first.prompts([*fan, quick]) == [quick]
    # A swap-in is no first token: its copy overlaps the step and it stays.
    back = _state(request("back", 16, 8), RequestState.ROTARY)
    assert first.prompts([back, quick]) == [back, quick]
    # Nothing light admitted: nothing sits out.
    heavy = FirstTokens.of(fan, budget_tokens=64, step_s=0.05, now=1.0, fits=fits_anywhere)
    assert not heavy.light and heavy.prompts(fan) == fan and not heavy.sits_out(fan[0])


def test_work_without_slack_never_sits_out() -> None:
    quick = _state(request("q", 4, 8, model="other"), RequestState.WAITING)
    first = FirstTokens.of([quick], budget_tokens=64, step_s=0.05, now=1.0, fits=fits_anywhere)
    # Decoding since t=0.95 with 10 tokens at 0.1 s each: 0.95 s of TBT slack.
    relaxed = _state(request("relaxed", 4, 32), RequestState.RUNNING, tokens=10, t_first=0.95)
    hurried = dataclasses.replace(request("hurried", 4, 32), slo=NO_SLACK)
    hurried = _state(hurried, RequestState.RUNNING, tokens=1, t_first=0.95)
    mine = _state(
        request("mine", 4, 32, model="other"), RequestState.RUNNING, tokens=1, t_first=0.0
    )
    assert first.decodes([relaxed, hurried, mine]) == [hurried, mine]
    prompt = _state(request("prompt", 2000, 1, t_arr=0.9), RequestState.RUNNING)
    late = dataclasses.replace(request("late", 2000, 1, t_arr=0.9), slo=NO_SLACK)
    assert first.prompt_waits(prompt) and not first.prompt_waits(late)
    # 1.5 s left would cover the wait (two 50 ms steps), but not the 32 steps of 64
    # tokens its 2,000 need after it: it keeps its place.
    behind = _state(request("behind", 2000, 1, t_arr=-2.5), RequestState.RUNNING)
    assert not first.prompt_waits(behind)


INTERACTIVE = SloSpec("interactive", ttft_s=1.0, tbt_s=0.05)
BATCH = SloSpec("batch", ttft_s=60.0, tbt_s=0.5)


def _of(rid: str, slo: SloSpec, prompt: int, *, model: str, t_arr: float = 0.9) -> Request:
    return dataclasses.replace(request(rid, prompt, 8, t_arr=t_arr, model=model), slo=slo)


def test_a_tighter_class_goes_first_whatever_its_length() -> None:
    """An interactive prompt of 500 tokens does not fit a 64-token step, but a batch
    tenant's decode beside it has time to spare: the chat model is light over every
    step its prompt takes, admitted or running, and the batch decode sits them out. A
    decode of a class tighter than the first token's never sits out."""
    bulk = _state(_of("bulk", BATCH, 4, model="tiny"), RequestState.RUNNING, tokens=2, t_first=0.9)
    chat = _of("chat", INTERACTIVE, 500, model="other")
    first = FirstTokens.of([chat], 64, 0.05, now=1.0, fits=fits_anywhere, decodes=[bulk])
    assert first.light == {"other"} and first.ttft_s == 1.0
    assert first.decodes([bulk]) == []
    chat.state, chat.num_computed_tokens = RequestState.RUNNING, 64  # its next chunk
    later = FirstTokens.of(
        [], 64, 0.05, now=1.0, fits=fits_anywhere, prefills=[chat], decodes=[bulk]
    )
    assert later.light == {"other"} and later.decodes([bulk]) == []
    # A batch prompt that fits one step is light among batch work, yet an interactive
    # decode of another model keeps its place.
    small = _of("small", BATCH, 16, model="tiny")
    tight = _state(
        _of("tight", INTERACTIVE, 4, model="third"), RequestState.RUNNING, tokens=50, t_first=0.5
    )
    loose = FirstTokens.of([small], 64, 0.05, now=1.0, fits=fits_anywhere, decodes=[tight])
    assert loose.light == {"tiny"} and loose.decodes([tight]) == [tight]


def test_one_class_or_a_late_first_token_keeps_the_one_step_rule() -> None:
    """Among work of one class, a prompt too long for one step is not light; nor is a
    tighter-class prompt already past its TTFT target, which has nothing left to win."""
    chat = _of("chat", INTERACTIVE, 500, model="other")
    peer = _state(
        _of("peer", INTERACTIVE, 4, model="tiny"), RequestState.RUNNING, tokens=2, t_first=0.9
    )
    assert not FirstTokens.of([chat], 64, 0.05, now=1.0, fits=fits_anywhere, decodes=[peer]).light
    late = _of("late", INTERACTIVE, 500, model="other", t_arr=-5.0)
    bulk = _state(_of("bulk", BATCH, 4, model="tiny"), RequestState.RUNNING, tokens=2, t_first=0.9)
    assert not FirstTokens.of([late], 64, 0.05, now=1.0, fits=fits_anywhere, decodes=[bulk]).light


def _fan_out_then_a_quick_request(target_s: float) -> tuple[EngineCore, list[Request], Request]:
    config = tiny_config(
        kv_blocks=20_000, models=(TINY, OTHER), max_batch_tokens=4096, max_running=256
    )
    scheduler = dataclasses.replace(config.scheduler, step_target_s=target_s)
    core, _ = make_core(dataclasses.replace(config, scheduler=scheduler))
    timed_linearly(core)
    fan = [request(f"f{i}", 16, 64) for i in range(128)]
    for r in fan:
        core.add_request(r)
    while any(r.num_output_tokens < 2 for r in fan):
        core.step()
    quick = request("quick", 4, 2, t_arr=core.clock.now(), model="other")
    core.add_request(quick)
    return core, fan, quick


def test_a_step_decodes_no_more_than_its_budget_and_every_decode_comes_round() -> None:
    # 4 ms a step plus 0.1 ms a token (helpers.linear_step_s): a 10 ms target fits 60.
    core, fan, _ = _fan_out_then_a_quick_request(0.01)
    budget = core.scheduler.step_budget
    assert budget is not None and budget.tokens < 128
    before = {r.id: r.num_output_tokens for r in fan}
    for _ in range(4):
        allowed = max(budget.min_tokens, budget.tokens)
        core.step()
        plan = core.executor.plans[-1]  # type: ignore[attr-defined]
        assert plan.num_batch_tokens <= allowed
    # The most slack waits: within four steps every one of the 128 got a token.
    assert all(r.num_output_tokens > before[r.id] for r in fan)


def test_the_step_that_computes_a_light_models_first_token_runs_it_alone() -> None:
    core, _, quick = _fan_out_then_a_quick_request(0.01)
    core.step()
    plan = core.executor.plans[-1]  # type: ignore[attr-defined]
    assert {e.request_id: e.num_tokens for e in plan.batch} == {"quick": 4}
    assert quick.num_output_tokens == 1
    core.step()  # the fan-out decodes again beside the quick request's decode
    plan = core.executor.plans[-1]  # type: ignore[attr-defined]
    assert sum(e.model == "tiny" for e in plan.batch) > 0


def test_a_prompt_too_long_for_one_step_shares_the_budget_with_decodes_beyond_it() -> None:
    core, _, quick = _fan_out_then_a_quick_request(0.01)
    core.step()
    assert quick.num_output_tokens == 1
    long = request("long", 400, 1, t_arr=core.clock.now(), model="other")
    core.add_request(long)
    chunks, decoded = [], []
    while long.num_output_tokens == 0:
        core.step()
        plan = core.executor.plans[-1]  # type: ignore[attr-defined]
        chunks.append(sum(e.num_tokens for e in plan.batch if e.request_id == "long"))
        decoded.append(sum(e.model == "tiny" for e in plan.batch))
    # Not light (400 tokens do not fit a step): nobody sits out for it, and it gets
    # about half of every step (max-min fair against 128 decodes) until it is done.
    assert sum(chunks) == 400 and min(chunks[1:-1]) >= 20
    assert min(decoded) >= 20
