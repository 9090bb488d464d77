"""Request lengths: the samplers, and each named workload against its published figures."""

from __future__ import annotations

import random
import statistics

import pytest

from shunter.engine.workload.generate import (
    lengths_from,
)
from shunter.engine.workload.lengths import (
    LMSYS_OUTPUT_MEAN,
    LMSYS_PROMPT_MEAN,
    SHAREGPT_OUTPUT_MEAN,
    SHAREGPT_PROMPT_MEAN,
    WORKLOADS,
    Percentiles,
    fixed_lengths,
    get_workload,
    resample,
    sharegpt_like,
)
from shunter.engine.workload.requests import WorkloadRequest


def test_sharegpt_like_lengths_follow_the_published_means_within_the_filter() -> None:
    rng = random.Random(0)
    pairs = [sharegpt_like(rng) for _ in range(20_000)]
    prompts = [p for p, _ in pairs]
    outputs = [o for _, o in pairs]
    assert all(4 <= p <= 1024 and o >= 4 and p + o <= 2048 for p, o in pairs)
    # The length filter trims the tails, so the means land a little below the source's.
    assert 0.8 * SHAREGPT_PROMPT_MEAN < statistics.fmean(prompts) < SHAREGPT_PROMPT_MEAN
    assert 0.8 * SHAREGPT_OUTPUT_MEAN < statistics.fmean(outputs) < SHAREGPT_OUTPUT_MEAN


def test_samplers_and_request_validation() -> None:
    rng = random.Random(0)
    assert fixed_lengths(10, 20)(rng) == (10, 20)
    pool = [(1, 2), (3, 4)]
    assert {resample(pool)(rng) for _ in range(50)} == set(pool)
    with pytest.raises(ValueError):
        resample([])
    with pytest.raises(ValueError):
        WorkloadRequest(0.0, 0, 5, "m")


def _draw(name: str, n: int, seed: int = 0) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [WORKLOADS[name].lengths(rng) for _ in range(n)]


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_each_workload_is_a_function_of_its_seed(name: str) -> None:
    assert _draw(name, 500, seed=1) == _draw(name, 500, seed=1)
    assert _draw(name, 500, seed=1) != _draw(name, 500, seed=2)
    assert WORKLOADS[name].description and WORKLOADS[name].sources


def test_sharegpt_gen_has_long_generated_outputs_and_short_prompts() -> None:
    pairs = _draw("sharegpt-gen", 50_000)
    outputs = [o for _, o in pairs]
    assert all(4 <= p <= 1024 for p, _ in pairs)
    assert all(4 <= o <= 8192 for o in outputs)
    # CASTILLO measured 1.65% of outputs above 2,048 and 0.44% above 8,192 (cut there).
    assert 0.01 < sum(o > 2048 for o in outputs) / len(outputs) < 0.03
    assert 0.002 < outputs.count(8192) / len(outputs) < 0.008
    assert any(p + o > 2048 for p, o in pairs)  # no total-length filter
    assert 500 < statistics.median(outputs) < 580  # CASTILLO's median: 536


def test_lmsys_lengths_follow_the_published_means() -> None:
    pairs = _draw("lmsys", 100_000)
    assert all(4 <= p <= 1024 and 4 <= o <= 8192 for p, o in pairs)
    # The limits cut well under 0.1% of each tail: the means stay the dataset's.
    assert statistics.fmean(p for p, _ in pairs) == pytest.approx(LMSYS_PROMPT_MEAN, rel=0.02)
    assert statistics.fmean(o for _, o in pairs) == pytest.approx(LMSYS_OUTPUT_MEAN, rel=0.02)


@pytest.mark.parametrize(
    ("name", "prompt_median", "output_median"),
    [("azure-code", 1469, 13), ("azure-conv", 1020, 129)],
)
def test_azure_lengths_follow_the_traces_token_counts(
    name: str, prompt_median: int, output_median: int
) -> None:
    pairs = _draw(name, 50_000)
    assert statistics.median(p for p, _ in pairs) == pytest.approx(prompt_median, rel=0.03)
    assert statistics.median(o for _, o in pairs) == pytest.approx(output_median, rel=0.05)


def test_percentiles_draw_within_the_measured_range() -> None:
    column = Percentiles("azure-conv", "output_tokens")
    draws = [column(random.Random(seed)) for seed in range(2_000)]
    assert min(draws) >= 7 and max(draws) <= 1000  # GeneratedTokens' min and max


def test_workload_names_are_checked() -> None:
    with pytest.raises(ValueError, match="choose from sharegpt, sharegpt-gen, lmsys"):
        get_workload("alpaca")
    assert get_workload("sharegpt", "file.json").name == "sharegpt"
    with pytest.raises(ValueError, match="replaces the lmsys workload"):
        lengths_from("file.json", "lmsys")
