"""VLT per state and parameter (SuperInfer §4.2.2, S_B = TBT SLO, S_F = TTFT SLO)."""

from __future__ import annotations

import pytest

from shunter.engine.config import SloSpec
from shunter.engine.request import Request, RequestState, slo_lost, slo_slack, tbt_lost


def make(state: RequestState, slo: SloSpec, **times: float | None) -> Request:
    r = Request(id="r", model="m", prompt_tokens=8, max_output_tokens=4, slo=slo, t_arr=10.0)
    r.state = state
    for name, value in times.items():
        setattr(r, name, value)
    return r


PAPER = SloSpec("paper", ttft_s=5.0, tbt_s=0.1, alpha=3.0, beta_b=0.0, beta_f=0.5)


@pytest.mark.parametrize(
    ("state", "slo", "times", "now", "expected"),
    [
        # waiting: relu(now - t_arr - beta_f * S_F); tolerance 0.5 * 5 s = 2.5 s
        (RequestState.WAITING, PAPER, {}, 11.0, 0.0),
        (RequestState.WAITING, PAPER, {}, 12.5, 0.0),
        (RequestState.WAITING, PAPER, {}, 14.0, 1.5),
        (RequestState.WAITING, SloSpec("f0", 5.0, 0.1, beta_f=0.0), {}, 14.0, 4.0),
        (RequestState.WAITING, SloSpec("f2", 1.0, 0.1, beta_f=2.0), {}, 14.0, 2.0),
        # rotary: alpha * relu(now - t_last - beta_b * S_B)
        (RequestState.ROTARY, PAPER, {"t_last": 20.0}, 20.5, 1.5),
        (RequestState.ROTARY, SloSpec("a1", 5.0, 0.1, alpha=1.0), {"t_last": 20.0}, 20.5, 0.5),
        (RequestState.ROTARY, SloSpec("b2", 5.0, 0.1, beta_b=2.0), {"t_last": 20.0}, 20.1, 0.0),
        (RequestState.ROTARY, SloSpec("b2", 5.0, 0.1, beta_b=2.0), {"t_last": 20.0}, 20.5, 0.9),
        (RequestState.ROTARY, SloSpec("a0", 5.0, 0.1, alpha=0.0), {"t_last": 20.0}, 99.0, 0.0),
        # rotary before its first token lags on TTFT: the waiting branch
        (RequestState.ROTARY, PAPER, {"t_last": None}, 14.0, 1.5),
        # running: -(now - t_run), whatever the SLO
        (RequestState.RUNNING, PAPER, {"t_run": 30.0}, 30.0, 0.0),
        (RequestState.RUNNING, PAPER, {"t_run": 30.0}, 32.5, -2.5),
        (RequestState.RUNNING, SloSpec("x", 1.0, 1.0, alpha=9.0), {"t_run": 30.0}, 31.0, -1.0),
    ],
)
def test_vlt(
    state: RequestState, slo: SloSpec, times: dict[str, float | None], now: float, expected: float
) -> None:
    assert make(state, slo, **times).vlt(now) == pytest.approx(expected)


def test_slo_slack_is_the_ttft_left_then_the_mean_token_budget_left() -> None:
    waiting = make(RequestState.WAITING, PAPER)  # arrived at 10 s, TTFT target 5 s
    decoding = make(RequestState.RUNNING, PAPER, t_first_token=20.0, num_output_tokens=3)
    rotary = make(RequestState.ROTARY, PAPER, t_first_token=20.0, num_output_tokens=3)
    # Waiting: 5 s less its wait. After 3 tokens: 3 x 0.1 s since the first, whatever
    # the state; negative once a token now would miss the SLO.
    assert slo_slack(waiting, 11.0) == pytest.approx(4.0)
    slacks = [slo_slack(r, 20.1) for r in (waiting, decoding, rotary)]
    assert slacks == pytest.approx([-5.1, 0.2, 0.2])
    assert slo_slack(decoding, 20.5) == pytest.approx(-0.2)


def test_tbt_lost_when_its_remaining_tokens_cannot_make_up_the_pace() -> None:
    """11 tokens at a mean of 0.1 s may take 1 s from the first; after 3 (the first at
    20 s), 8 more at one a step of 0.05 s take 0.4 s: lost once it is more than 0.6 s
    past its first token."""
    r = make(RequestState.ROTARY, PAPER, t_first_token=20.0, num_output_tokens=3)
    r.max_output_tokens = 11
    assert not tbt_lost(r, 20.5, 0.05)
    assert tbt_lost(r, 20.7, 0.05)
    assert not tbt_lost(r, 20.7, None)  # no step measured yet: nothing to judge by
    assert tbt_lost(r, 20.5, 0.1)  # steps at the target gain nothing back
    r.t_first_token, r.num_output_tokens = None, 0
    assert not tbt_lost(r, 100.0, 0.05)  # no first token: its TTFT is at stake
    r.t_first_token, r.max_output_tokens = 20.0, 1
    assert not tbt_lost(r, 100.0, 0.05)  # one token has no gaps


def test_slo_lost_once_the_first_token_is_late_or_the_tbt_target_out_of_reach() -> None:
    """Arrived at 10 s with a 5 s TTFT target: lost from 15 s without a first token, and
    for good once its first token came after 15 s, however fast its tokens come then;
    with its first token in time, lost when its TBT target is out of reach."""
    waiting = make(RequestState.WAITING, PAPER)
    assert not slo_lost(waiting, 14.9, 0.05)
    assert slo_lost(waiting, 15.0, 0.05)
    late = make(RequestState.RUNNING, PAPER, t_first_token=15.5, num_output_tokens=3)
    assert slo_lost(late, 15.6, 0.05)  # on its TBT pace, but its TTFT missed
    on_time = make(RequestState.RUNNING, PAPER, t_first_token=14.0, num_output_tokens=3)
    on_time.max_output_tokens = 11  # 1 s of token gaps from 14 s; 8 more a step each
    assert not slo_lost(on_time, 14.5, 0.05)  # behind its pace, but it can catch up
    assert slo_slack(on_time, 14.5) < 0.0
    assert slo_lost(on_time, 14.7, 0.05)
    assert not slo_lost(on_time, 14.7, None)  # no step measured yet


def test_token_accounting_and_latencies() -> None:
    r = make(RequestState.RUNNING, PAPER, t_run=10.0)
    assert (r.num_tokens, r.num_pending_tokens, r.is_prefill) == (8, 8, True)
    r.num_computed_tokens = 8
    r.record_token(11.0, 7)
    assert (r.num_tokens, r.num_pending_tokens, r.is_prefill) == (9, 1, False)
    r.num_computed_tokens = 9
    r.record_token(11.5, None)
    r.record_token(12.5, None)
    assert r.ttft == pytest.approx(1.0)
    assert r.tpot == pytest.approx(0.75)
    assert r.token_times == [11.0, 11.5, 12.5]
    assert r.output_token_ids == [7]


@pytest.mark.parametrize(
    "kwargs",
    [{"prompt_tokens": 0}, {"max_output_tokens": 0}, {"prompt_token_ids": [1, 2]}],
)
def test_invalid_requests(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {
        "id": "r",
        "model": "m",
        "prompt_tokens": 3,
        "max_output_tokens": 1,
        "slo": PAPER,
        "t_arr": 0.0,
    }
    with pytest.raises(ValueError):
        Request(**{**base, **kwargs})  # type: ignore[arg-type]


def test_token_ids_run_from_the_prompt_into_the_output() -> None:
    slo = SloSpec("s", ttft_s=1.0, tbt_s=0.1)
    r = Request("r", "m", 3, 4, slo, 0.0, prompt_token_ids=[10, 11, 12])
    r.record_token(0.1, 20)
    r.record_token(0.2, 21)
    assert r.token_ids(0, 3) == [10, 11, 12]
    assert r.token_ids(1, 5) == [11, 12, 20, 21]
    assert r.token_ids(4, 5) == [21]
    with pytest.raises(ValueError, match="no prompt token ids"):
        Request("q", "m", 3, 4, slo, 0.0).token_ids(0, 1)
