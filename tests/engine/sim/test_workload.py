import json
import random
import statistics
from pathlib import Path

import pytest

from shunter.engine.sim.workload import (
    SHAREGPT_OUTPUT_MEAN,
    SHAREGPT_PROMPT_MEAN,
    WorkloadRequest,
    fixed_lengths,
    gamma_arrivals,
    load_sharegpt,
    poisson_arrivals,
    read_trace,
    resample,
    sharegpt_like,
    synthetic_workload,
    write_trace,
)


def test_same_seed_same_workload_other_seed_other_workload() -> None:
    a = synthetic_workload(rate=8, duration_s=30, model="m", seed=1)
    b = synthetic_workload(rate=8, duration_s=30, model="m", seed=1)
    c = synthetic_workload(rate=8, duration_s=30, model="m", seed=2)
    assert a == b
    assert a != c
    assert len(a) == 240


@pytest.mark.parametrize("rate", [0.5, 4.0, 20.0])
def test_poisson_arrivals_have_the_requested_rate(rate: float) -> None:
    times = poisson_arrivals(rate, 20_000, random.Random(0))
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert times == sorted(times)
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.03)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_arrivals_keep_the_rate_and_set_burstiness(cv: float) -> None:
    times = gamma_arrivals(10.0, cv, 40_000, random.Random(3))
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.05)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1)


def test_sharegpt_like_lengths_follow_the_published_means_within_the_filter() -> None:
    rng = random.Random(0)
    pairs = [sharegpt_like(rng) for _ in range(20_000)]
    prompts = [p for p, _ in pairs]
    outputs = [o for _, o in pairs]
    assert all(4 <= p <= 1024 and o >= 4 and p + o <= 2048 for p, o in pairs)
    # The length filter trims the tails, so the means land a little below the source's.
    assert 0.8 * SHAREGPT_PROMPT_MEAN < statistics.fmean(prompts) < SHAREGPT_PROMPT_MEAN
    assert 0.8 * SHAREGPT_OUTPUT_MEAN < statistics.fmean(outputs) < SHAREGPT_OUTPUT_MEAN


def test_jsonl_trace_round_trip(tmp_path: Path) -> None:
    requests = synthetic_workload(rate=4, duration_s=5, model="qwen2.5-32b", seed=7)
    path = tmp_path / "trace.jsonl"
    write_trace(path, requests)
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"t", "prompt_tokens", "output_tokens", "model"}
    assert read_trace(path) == requests


def test_read_trace_sorts_and_reports_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"t": 2.0, "prompt_tokens": 5, "output_tokens": 6, "model": "a"}\n\n'
        '{"t": 1.0, "prompt_tokens": 7, "output_tokens": 8, "model": "b"}\n'
    )
    assert [r.model for r in read_trace(path)] == ["b", "a"]
    path.write_text('{"t": 1.0, "prompt_tokens": 7}\n')
    with pytest.raises(ValueError, match=":1:"):
        read_trace(path)


def test_sharegpt_loader_takes_first_human_turn_and_its_reply(tmp_path: Path) -> None:
    data = [
        {
            "id": "a",
            "conversations": [
                {"from": "human", "value": "one two three four five"},
                {"from": "gpt", "value": "six seven eight nine ten eleven"},
                {"from": "human", "value": "ignored follow-up question here"},
                {"from": "gpt", "value": "ignored"},
            ],
        },
        # Starts with the model: the first human turn is the second one.
        {
            "id": "b",
            "conversations": [
                {"from": "gpt", "value": "hello there friend of mine"},
                {"from": "human", "value": "w1 w2 w3 w4"},
                {"from": "gpt", "value": "r1 r2 r3 r4 r5"},
            ],
        },
        # No reply: skipped.
        {"id": "c", "conversations": [{"from": "human", "value": "a b c d e"}]},
        # Too short a reply for vLLM's filter: skipped.
        {
            "id": "d",
            "conversations": [
                {"from": "human", "value": "a b c d e"},
                {"from": "gpt", "value": "ok"},
            ],
        },
        {"id": "e", "conversations": []},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    words = lambda text: len(text.split())  # noqa: E731
    assert load_sharegpt(path, words) == [(5, 6), (4, 5)]
    # The default estimates four characters per token.
    assert load_sharegpt(path)[0] == (round(len("one two three four five") / 4), 8)


def test_samplers_and_request_validation() -> None:
    rng = random.Random(0)
    assert fixed_lengths(10, 20)(rng) == (10, 20)
    pool = [(1, 2), (3, 4)]
    assert {resample(pool)(rng) for _ in range(50)} == set(pool)
    with pytest.raises(ValueError):
        resample([])
    with pytest.raises(ValueError):
        WorkloadRequest(0.0, 0, 5, "m")
