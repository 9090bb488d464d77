"""The step budget: tokens per step from the measured step cost, and the scheduler
chunking a long prompt under it while decodes keep their place in every step."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from shunter.engine.core import EngineCore
from shunter.engine.plan import StepPlan
from shunter.engine.sched.shares import fair_shares
from shunter.engine.sched.step_budget import StepBudget, StepShape
from tests.engine.fakes import make_core, request, tiny_config
from tests.engine.sched.helpers import OVERHEAD_S, PER_TOKEN_S, linear_step_s, timed_linearly


def test_the_budget_fits_the_target_from_a_linear_step_cost() -> None:
    budget = StepBudget(0.05, max_tokens=8192)
    for n in [1, 2, 300, 1, 120, 1, 1, 256, 64, 1] * 3:
        budget.observe(n, linear_step_s(n))
    assert budget.overhead_s == pytest.approx(OVERHEAD_S, rel=1e-6)
    assert budget.per_token_s == pytest.approx(PER_TOKEN_S, rel=1e-6)
    assert abs(budget.tokens - 460) <= 1  # (0.05 - OVERHEAD_S) / PER_TOKEN_S
    assert linear_step_s(budget.tokens) <= 0.05 + 1e-9


def test_before_any_step_and_at_the_bounds() -> None:
    budget = StepBudget(0.05, max_tokens=8192, min_tokens=32, initial_tokens=256)
    assert budget.tokens == 256 and budget.per_token_s is None
    budget.observe(0, 5.0)  # a step of copies only says nothing about tokens
    assert budget.tokens == 256
    slow = StepBudget(0.05, max_tokens=8192, min_tokens=32)
    slow.observe(10, 1.0)
    assert slow.tokens == 32  # under the target's reach: the least chunk still runs
    fast = StepBudget(0.05, max_tokens=1024)
    fast.observe(100, 1e-5)
    assert fast.tokens == 1024  # never above the fixed budget


def test_steps_of_one_size_count_their_whole_cost_per_token() -> None:
    budget = StepBudget(0.05, max_tokens=8192)
    for _ in range(20):
        budget.observe(100, linear_step_s(100))
    # Overhead and per-token cost cannot be told apart: the budget errs small.
    assert budget.overhead_s == 0.0
    assert budget.per_token_s == pytest.approx(linear_step_s(100) / 100)
    assert linear_step_s(budget.tokens) <= 0.05


def test_a_run_of_decode_steps_keeps_the_cost_per_token_once_fitted() -> None:
    budget = StepBudget(0.05, max_tokens=8192)
    for n in [1, 300, 64, 1, 200] * 4:
        budget.observe(n, linear_step_s(n))
    fitted = budget.tokens
    # Minutes of one-token decode steps: their size does not spread, but the cost per
    # token fitted before still holds, so the next prompt is not cut to least chunks.
    for _ in range(200):
        budget.observe(1, linear_step_s(1))
    assert budget.per_token_s == pytest.approx(PER_TOKEN_S, rel=1e-6)
    assert budget.overhead_s == pytest.approx(OVERHEAD_S, rel=1e-3)
    assert abs(budget.tokens - fitted) <= 1


def test_the_budget_follows_a_device_that_slows_down() -> None:
    budget = StepBudget(0.05, max_tokens=8192)
    sizes = [1, 50, 200, 400]
    for n in sizes * 5:
        budget.observe(n, linear_step_s(n))
    before = budget.tokens
    for n in sizes * 10:
        budget.observe(n, 3 * linear_step_s(n))
    assert budget.tokens < before / 2
    assert 3 * linear_step_s(budget.tokens) <= 0.05 * 1.01


def _long_prompt_beside_a_decode(step_target_s: float | None) -> tuple[EngineCore, list[StepPlan]]:
    """A decoding request, then a 2,000-token prompt; the plans of the steps until the
    prompt's first token."""
    config = tiny_config(kv_blocks=600, max_batch_tokens=4096)
    scheduler = dataclasses.replace(config.scheduler, step_target_s=step_target_s)
    core, _ = make_core(dataclasses.replace(config, scheduler=scheduler))
    timed_linearly(core)
    chat, long = request("chat", 8, 200), request("long", 2000, 1)
    core.add_request(chat)
    while chat.num_output_tokens < 2:
        core.step()
    core.add_request(long)
    plans = []
    while long.num_output_tokens == 0:
        core.step()
        plans.append(core.executor.plans[-1])  # type: ignore[attr-defined]
    return core, plans


def test_a_long_prompt_is_chunked_within_the_step_target_and_decodes_run_between() -> None:
    target = 0.05
    core, plans = _long_prompt_beside_a_decode(target)
    chunks = [e.num_tokens for p in plans for e in p.batch if e.request_id == "long"]
    assert sum(chunks) == 2000 and len(chunks) >= 4
    # Every step of the prompt also gave the decoding request its next token.
    assert all(any(e.request_id == "chat" and e.samples for e in p.batch) for p in plans)
    # Once the cost is measured, no step runs over the target.
    assert all(linear_step_s(p.num_batch_tokens) <= target for p in plans[2:])
    assert core.scheduler.step_tokens < 4096


def test_without_a_step_target_the_fixed_budget_takes_the_prompt_in_one_step() -> None:
    _, plans = _long_prompt_beside_a_decode(None)
    assert [e.num_tokens for p in plans for e in p.batch if e.request_id == "long"] == [2000]


# Two models on a GPU-like device: each pass reads its weights (flat to a knee), and the
# step adds 5 ms of host work. Both passes together cost 25 ms before any prompt token.
PASS_FLOOR_S = {"small": 0.008, "large": 0.012}
PASS_TOKEN_S = 0.00004  # past the knee: 300 tokens for the large model
STEP_REST_S = 0.005


def pass_s(model: str, tokens: int) -> float:
    return max(PASS_FLOOR_S[model], PASS_TOKEN_S * tokens)


def passes_step(budget: StepBudget, tokens: dict[str, int]) -> float:
    """Observe one step of these passes, one sequence each; return its duration."""
    passes = {m: (n, pass_s(m, n)) for m, n in tokens.items() if n}
    duration = STEP_REST_S + sum(s for _, s in passes.values())
    budget.observe(sum(tokens.values()), duration, passes, num_seqs=len(passes))
    return duration


def one_sequence_each(demand: dict[str, int]) -> Callable[[int], StepShape]:
    """A step's shape for a budget: ``demand`` split max-min fairly, one sequence each."""

    def shape(total: int) -> StepShape:
        tokens = fair_shares(demand, total)
        return StepShape(tokens, sum(1 for n in tokens.values() if n))

    return shape


def test_a_step_of_two_models_takes_the_tokens_their_weight_reads_pay_for() -> None:
    budget = StepBudget(0.020, max_tokens=8192)
    for small, large in [(1, 1), (2, 40), (1, 200), (3, 1000), (1, 600), (2, 100)] * 3:
        passes_step(budget, {"small": small, "large": large})
    # The whole-step line says 20 ms fit the least chunk; the passes say otherwise: the
    # large model's tokens cost nothing up to its knee (200 tokens measured flat), and
    # the step may then grow 10% over its least.
    total = budget.tokens_for(one_sequence_each({"small": 2, "large": 5000}))
    assert budget.tokens == budget.min_tokens
    assert total - 2 > 200
    least = STEP_REST_S + PASS_FLOOR_S["small"] + PASS_FLOOR_S["large"]
    assert STEP_REST_S + pass_s("small", 2) + pass_s("large", total - 2) <= 1.1 * least + 1e-9
    # Alone, the large model's least step is under the target: the target bounds it,
    # and it takes more tokens than beside the small model.
    alone = budget.tokens_for(one_sequence_each({"large": 5000}))
    assert alone > total - 2
    assert STEP_REST_S + pass_s("large", alone) <= 0.020
    # A demand that fits whole is the budget.
    assert budget.tokens_for(one_sequence_each({"small": 3, "large": 100})) == 103


def test_a_model_without_a_measured_pass_gets_the_whole_step_estimate() -> None:
    budget = StepBudget(0.020, max_tokens=8192)
    for n in [1, 40, 200, 1000]:
        passes_step(budget, {"large": n})
    assert budget.tokens_for(one_sequence_each({"large": 5000, "new": 10})) == budget.tokens
    assert budget.tokens_for(one_sequence_each({})) == budget.tokens
    plain = StepBudget(0.020, max_tokens=8192)
    plain.observe(100, 0.02)  # an executor that reports no passes
    assert plain.tokens_for(one_sequence_each({"large": 5000})) == plain.tokens


def test_host_work_per_sequence_bounds_a_step_of_many_decodes() -> None:
    # A CPU-like engine: each pass is cheap, but each sequence costs 0.05 ms of host work
    # (sampling, delivery). A fan-out of 128 decodes must not be priced as one pass.
    budget = StepBudget(0.004, max_tokens=8192)
    for seqs in [1, 4, 16, 64, 128, 2, 32]:
        duration = 0.001 + 0.00005 * seqs + 0.0005
        budget.observe(seqs, duration, {"m": (seqs, 0.0005)}, num_seqs=seqs)

    def decodes(total: int) -> StepShape:
        n = min(total, 128)
        return StepShape({"m": n}, n)

    total = budget.tokens_for(decodes)
    assert 40 <= total <= 50  # (4 - 1.5) ms / 0.05 ms a sequence
