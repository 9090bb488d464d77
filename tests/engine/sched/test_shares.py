"""Max-min fair shares of a step's prefill tokens, and the scheduler using them so that
one model's long prompt or burst never holds a step while another model's request
waits."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shunter.engine.config import SloSpec
from shunter.engine.core import EngineCore
from shunter.engine.sched.shares import fair_shares
from tests.engine.fakes import SLO, TINY, make_core, request, tiny_config
from tests.engine.sched.helpers import linear_step_s, timed_linearly

OTHER = dataclasses.replace(TINY, name="other")


@pytest.mark.parametrize(
    ("demand", "tokens", "expected"),
    [
        ({"a": 2000, "b": 4}, 64, {"a": 60, "b": 4}),
        ({"a": 2000, "b": 2000}, 64, {"a": 32, "b": 32}),
        ({"a": 10, "b": 20}, 64, {"a": 10, "b": 20}),
        ({"a": 100, "b": 30, "c": 5}, 90, {"a": 55, "b": 30, "c": 5}),
        ({"a": 5, "b": 5, "c": 5}, 2, {"a": 1, "b": 1, "c": 0}),
        ({"a": 0, "b": 7}, 64, {"a": 0, "b": 7}),
        ({"a": 9}, 0, {"a": 0}),
    ],
)
def test_fair_shares(demand: dict[str, int], tokens: int, expected: dict[str, int]) -> None:
    assert fair_shares(demand, tokens) == expected


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 5000), max_size=6),
    st.integers(0, 10_000),
)
def test_shares_use_every_token_while_demand_is_left_and_no_model_gets_more_than_it_wants(
    demand: dict[str, int], tokens: int
) -> None:
    shares = fair_shares(demand, tokens)
    assert set(shares) == set(demand)
    assert all(0 <= shares[m] <= demand[m] for m in demand)
    assert sum(shares.values()) == min(tokens, sum(demand.values()))
    # Max-min fair: a model short of its demand has at least every other model's share,
    # give or take the one token a remainder hands out.
    for m in demand:
        if shares[m] < demand[m]:
            assert all(shares[m] >= shares[o] - 1 for o in demand)


@pytest.mark.parametrize("policy", ["lvf", "fcfs"])
def test_a_long_prompt_of_one_model_does_not_hold_back_another_models_request(
    policy: str,
) -> None:
    core, _ = make_core(
        tiny_config(kv_blocks=1200, models=(TINY, OTHER), policy=policy, max_batch_tokens=64)
    )
    long = request("long", 2000, 1)
    core.add_request(long)
    core.step()
    core.step()  # the prompt is being prefilled, 64 tokens a step
    quick = request("quick", 4, 2, t_arr=core.clock.now(), model="other")
    core.add_request(quick)
    core.step()
    plan = core.executor.plans[-1]  # type: ignore[attr-defined]
    chunks = {e.request_id: e.num_tokens for e in plan.batch}
    assert chunks == {"long": 60, "quick": 4}
    assert quick.num_output_tokens == 1 and long.num_output_tokens == 0


def _long_prompt_then_a_quick_request(long_slo: SloSpec) -> tuple[EngineCore, list[dict[str, int]]]:
    """A 2,000-token prompt (``long_slo``) under a 50 ms step target, then a 4-token
    request of another model: the batches of the two steps after it arrives."""
    config = tiny_config(kv_blocks=1200, models=(TINY, OTHER), max_batch_tokens=4096)
    scheduler = dataclasses.replace(config.scheduler, step_target_s=0.05)
    core, _ = make_core(dataclasses.replace(config, scheduler=scheduler))
    timed_linearly(core)
    long = dataclasses.replace(request("long", 2000, 1), slo=long_slo)
    core.add_request(long)
    for _ in range(2):
        core.step()
    quick = request("quick", 4, 2, t_arr=core.clock.now(), model="other")
    core.add_request(quick)
    plans = []
    for _ in range(2):
        core.step()
        plans.append({e.request_id: e.num_tokens for e in core.executor.plans[-1].batch})  # type: ignore[attr-defined]
    return core, plans


def test_a_long_prompt_with_time_to_spare_sits_out_another_models_first_token() -> None:
    _, plans = _long_prompt_then_a_quick_request(SLO)  # 5 s to its first token
    assert plans[0] == {"quick": 4}
    # Its first token came with that short step; now it decodes, and the prompt takes
    # its whole budget again.
    assert plans[1]["quick"] == 1 and plans[1]["long"] > 4


def test_a_long_prompt_without_time_to_spare_keeps_its_share_beside_a_first_token() -> None:
    # Its TTFT target is already behind it: it cannot wait a step, nor shrink to a least
    # chunk. It keeps its fair share of the step budget beside the first token, and the
    # step stays within its target.
    core, plans = _long_prompt_then_a_quick_request(SloSpec("tight", ttft_s=0.001, tbt_s=0.1))
    least = core.scheduler.step_budget.min_tokens  # type: ignore[union-attr]
    assert plans[0]["quick"] == 4 and plans[0]["long"] > least
    assert linear_step_s(sum(plans[0].values())) <= 0.05 + 1e-9
    assert plans[1]["quick"] == 1 and plans[1]["long"] > least
