"""Runs end to end: against the SSE fixture and against a real ``shunter engine`` process
on tiny-llama, both streamed, each server in its own process."""

from __future__ import annotations

import itertools
import json
import random
import statistics
from pathlib import Path

import pytest

from shunter.engine.loadgen.arrivals import ArrivalProcess
from shunter.engine.loadgen.cli import SAMPLE_SHAREGPT
from shunter.engine.loadgen.client import Target
from shunter.engine.loadgen.report import Slo
from shunter.engine.loadgen.runner import run_rate
from shunter.engine.workload.sharegpt import sharegpt_workload
from shunter.engine.workload.sources import LengthDist, SyntheticWorkload
from shunter.engine.workload.tokens import token_counter
from shunter.engine.workload.traces import trace_workload
from tests.engine.loadgen.conftest import ENGINE_MODEL, ENGINE_TOKEN

pytestmark = pytest.mark.slow


def synthetic(prompt: str, output: str) -> SyntheticWorkload:
    return SyntheticWorkload(LengthDist.parse(prompt), LengthDist.parse(output))


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_fixture_run_is_on_time_and_complete(sse_url: str, endpoint: str) -> None:
    target = Target(sse_url, "fixture", api_key="fx-key", endpoint=endpoint)  # type: ignore[arg-type]
    result = run_rate(target, synthetic("16", "20..40"), 50.0, num_requests=60, seed=3)
    report = result.report
    assert (report.completed, report.failed) == (60, 0)
    for r in result.requests:
        assert r.output_tokens == r.expected_output_tokens == len(r.token_times)
        assert r.input_tokens == 16  # the fixture's usage counts prompt words
    # ITL is the gap between consecutive tokens as the client saw them arrive, and no
    # shorter than the fixture's pacing of 2 ms (tokens stamped late, in a burst, would
    # be ~0 apart).
    gaps = [b - a for r in result.requests for a, b in itertools.pairwise(r.token_times)]
    assert report.median_itl_ms == pytest.approx(1000 * statistics.median(gaps))
    assert report.median_itl_ms > 1.5
    assert report.total_output_tokens == sum(r.expected_output_tokens for r in result.requests)
    # Requests go out on their own schedule, not behind earlier responses: the typical
    # lag is a fraction of a response's time (sent in turn, it would grow by about a
    # response's time with every request).
    assert report.send_lag_p50_ms is not None and report.median_e2el_ms is not None
    assert report.send_lag_p50_ms < report.median_e2el_ms / 2
    # The requests went out on their schedule, in order.
    scheduled = [r.t_scheduled for r in result.requests]
    assert scheduled == sorted(scheduled)
    assert all((r.t_sent or 0) >= r.t_scheduled for r in result.requests)
    doc = json.loads(json.dumps(result.to_dict(with_requests=True)))
    assert doc["completed"] == 60 and len(doc["requests"]) == 60
    assert len(doc["requests"][0]["token_times"]) == result.requests[0].output_tokens


def test_fixture_refusals_count_as_failures(sse_url: str) -> None:
    wrong_key = run_rate(
        Target(sse_url, "fixture", api_key="nope"), synthetic("4", "4"), 100.0, num_requests=5
    )
    assert wrong_key.report.failed == 5 and wrong_key.report.error_counts == {"invalid_api_key": 5}
    wrong_model = run_rate(
        Target(sse_url, "other", api_key="fx-key"), synthetic("4", "4"), 100.0, num_requests=3
    )
    assert wrong_model.report.error_counts == {"model_not_found": 3}
    (error, *_) = wrong_model.report.errors
    assert error.startswith("model_not_found: ") and len(wrong_model.report.errors) == 3
    assert wrong_model.report.slo_attainment == 0.0 and wrong_model.report.request_goodput == 0.0
    assert {r.status for r in wrong_model.requests} == {404}


def test_max_concurrency_against_the_fixture(sse_url: str) -> None:
    target = Target(sse_url, "fixture", api_key="fx-key")
    result = run_rate(
        target, synthetic("4", "25"), float("inf"), num_requests=12, max_concurrency=3
    )
    assert result.report.completed == 12 and result.report.max_concurrency == 3
    # Never more than three streams at once: each start waits for an earlier end.
    starts = [(r.t_start or 0.0, 1) for r in result.requests]
    ends = [(r.t_end or 0.0, -1) for r in result.requests]
    live = peak = 0
    for _, step in sorted(starts + ends):
        live += step
        peak = max(peak, live)
    assert peak == 3


def test_engine_completions_streamed(engine_url: str, tiny_llama: Path) -> None:
    target = Target(engine_url, ENGINE_MODEL, api_key=ENGINE_TOKEN)
    workload = SyntheticWorkload(
        LengthDist.parse("8..24"), LengthDist.parse("4..16"), token_counter(tiny_llama)
    )
    result = run_rate(
        target, workload, 20.0, num_requests=12, seed=1, slo=Slo(ttft_s=30.0, tpot_s=5.0)
    )
    report = result.report
    assert (report.completed, report.failed) == (12, 0), report.error_counts
    for r in result.requests:
        # ignore_eos: the engine produced exactly the requested tokens (its usage).
        assert r.output_tokens == r.expected_output_tokens
        assert 1 <= len(r.token_times) <= r.output_tokens
        assert r.t_start is not None and r.token_times[0] > r.t_start
    assert report.total_output_tokens == sum(r.expected_output_tokens for r in result.requests)
    assert report.mean_ttft_ms is not None and report.mean_ttft_ms > 0
    assert report.mean_tpot_ms is not None and report.p99_itl_ms is not None
    assert report.slo_attainment == 1.0 and report.request_goodput > 0


def test_engine_chat_with_sharegpt_and_a_trace(
    engine_url: str, tiny_llama: Path, tmp_path: Path
) -> None:
    target = Target(engine_url, ENGINE_MODEL, api_key=ENGINE_TOKEN, endpoint="chat")
    count = token_counter(tiny_llama)
    sharegpt = sharegpt_workload(SAMPLE_SHAREGPT, count)
    result = run_rate(target, sharegpt, 10.0, num_requests=6, seed=2)
    assert result.report.completed == 6, result.report.error_counts
    expected = [s.output_len for s in sharegpt.draw(6, _seeded_after_arrivals(2, 6))]
    assert [r.output_tokens for r in result.requests] == expected
    # A tight TBT SLO on a CPU engine: TTFT met, TBT missed, both counted.
    strict = run_rate(
        target, sharegpt, 10.0, num_requests=4, seed=2, slo=Slo(ttft_s=60.0, tpot_s=1e-6)
    )
    assert strict.report.ttft_attainment == 1.0 and strict.report.tbt_attainment == 0.0
    assert strict.report.request_goodput == 0.0

    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"t": t, "prompt_tokens": 6, "output_tokens": 5}) + "\n"
            for t in (0.0, 0.1, 0.3)
        )
    )
    replay = run_rate(
        Target(engine_url, ENGINE_MODEL, api_key=ENGINE_TOKEN), trace_workload(trace), None
    )
    assert replay.report.completed == 3 and replay.report.burstiness is None
    assert [r.t_scheduled for r in replay.requests] == pytest.approx([0.0, 0.1, 0.3])
    assert replay.report.request_rate == pytest.approx(2 / 0.3)


def _seeded_after_arrivals(seed: int, n: int) -> random.Random:
    """The generator ``run_rate`` samples requests with: arrivals are drawn first."""
    rng = random.Random(seed)
    ArrivalProcess().times(10.0, rng, num_requests=n)
    return rng
