"""A rate's report on hand-built requests, every figure computed by hand."""

from __future__ import annotations

import json
import math

import pytest

from shunter.engine.loadgen.client import RequestResult
from shunter.engine.loadgen.report import Slo, build_report, csv_rows, format_report

SLO = Slo(ttft_s=1.0, tpot_s=0.1)


def result(
    index: int,
    start: float,
    tokens: list[float],
    *,
    output_tokens: int | None = None,
    input_tokens: int = 10,
    sent_after: float = 0.001,
    end: float | None = None,
    success: bool = True,
    error_type: str | None = None,
) -> RequestResult:
    r = RequestResult(index, start, input_tokens, len(tokens))
    r.t_start, r.t_sent = start, start + sent_after
    r.token_times = list(tokens)
    r.output_tokens = len(tokens) if output_tokens is None else output_tokens
    r.t_end = end if end is not None else (tokens[-1] if tokens else start)
    r.success = success
    r.status = 200 if success else 500
    r.error_type = error_type
    return r


@pytest.fixture
def requests() -> list[RequestResult]:
    return [
        # TTFT 500 ms, TPOT (0.65 - 0.5) / 3 = 50 ms, gaps 50, 50, 50: meets both.
        result(0, 0.0, [0.5, 0.55, 0.6, 0.65], input_tokens=10, sent_after=0.001),
        # One token: TTFT 200 ms, no TPOT and no gap; meets both.
        result(1, 1.0, [1.2], input_tokens=20, sent_after=0.002),
        # TTFT 300 ms meets; TPOT 300 ms misses the TBT SLO; gaps 300, 300.
        result(2, 2.0, [2.3, 2.6, 2.9], input_tokens=30, sent_after=0.004),
        # A failed request (HTTP 500): misses both, ends the run at 4 s.
        result(
            3, 3.0, [], input_tokens=40, sent_after=0.003, end=4.0, success=False,
            error_type="server_error",
        ),
    ]  # fmt: skip


def test_report_fields_match_hand_computed_values(requests: list[RequestResult]) -> None:
    r = build_report(requests, slo=SLO, request_rate=1.0, burstiness=1.0, max_concurrency=None)
    assert r.duration == pytest.approx(4.0)  # start of the run to the last request's end
    assert (r.num_prompts, r.completed, r.failed) == (4, 3, 1)
    assert r.error_counts == {"server_error": 1}
    assert r.errors == ["", "", "", "server_error"]  # one per request, as vLLM writes
    assert r.total_input_tokens == 60  # succeeded requests only, as vLLM counts
    assert r.total_output_tokens == 8
    assert r.request_throughput == pytest.approx(3 / 4)
    assert r.output_throughput == pytest.approx(8 / 4)
    assert r.total_token_throughput == pytest.approx(68 / 4)
    # TTFT 500, 200, 300 ms.
    assert r.mean_ttft_ms == pytest.approx(1000 / 3)
    assert r.median_ttft_ms == pytest.approx(300)
    assert r.p99_ttft_ms == pytest.approx(300 + 200 * 0.98)  # rank (3 - 1) * 0.99 = 1.98
    # TPOT 50 and 300 ms: the one-token request has none.
    assert r.mean_tpot_ms == pytest.approx(175)
    assert r.median_tpot_ms == pytest.approx(175)
    assert r.p90_tpot_ms == pytest.approx(50 + 250 * 0.9)
    # Gaps 50, 50, 50, 300, 300 ms.
    assert r.mean_itl_ms == pytest.approx(150)
    assert r.median_itl_ms == pytest.approx(50)
    assert r.itl_within_tbt == pytest.approx(3 / 5)
    # E2E to the last token: 650, 200, 900 ms.
    assert r.mean_e2el_ms == pytest.approx(1750 / 3)
    assert r.median_e2el_ms == pytest.approx(650)
    # Attainment over all four: TTFT met by three, TBT by two, both by two.
    assert r.ttft_attainment == pytest.approx(0.75)
    assert r.tbt_attainment == pytest.approx(0.5)
    assert r.slo_attainment == pytest.approx(0.5)
    assert r.request_goodput == pytest.approx(2 / 4)
    # Send lags 1, 2, 4, 3 ms; sends at 0.001, 1.002, 2.004, 3.003.
    assert r.send_lag_p50_ms == pytest.approx(2.5)
    assert r.send_lag_max_ms == pytest.approx(4.0)
    assert r.achieved_request_rate == pytest.approx(3 / 3.002)


def test_one_token_response_meets_tbt_and_has_no_tpot() -> None:
    r = build_report(
        [result(0, 0.0, [0.4])], slo=SLO, request_rate=1.0, burstiness=1.0, max_concurrency=1
    )
    assert r.mean_tpot_ms is None and r.mean_itl_ms is None and r.itl_within_tbt is None
    assert r.mean_ttft_ms == pytest.approx(400)
    assert (r.ttft_attainment, r.tbt_attainment, r.slo_attainment) == (1.0, 1.0, 1.0)


def test_failed_request_with_tokens_misses_and_is_left_out_of_latencies() -> None:
    cut = result(0, 0.0, [0.1, 0.15], success=False, error_type="incomplete_stream")
    ok = result(1, 0.0, [0.2, 0.3])
    r = build_report([cut, ok], slo=SLO, request_rate=2.0, burstiness=1.0, max_concurrency=None)
    assert r.failed == 1 and r.error_counts == {"incomplete_stream": 1}
    assert r.mean_ttft_ms == pytest.approx(200)  # the failed request's 100 ms is not counted
    assert r.slo_attainment == pytest.approx(0.5)
    assert r.total_output_tokens == 2


def test_ttft_counts_from_the_issue_not_the_schedule() -> None:
    """Under --max-concurrency a request waits for a slot: TTFT starts when it is issued;
    the wait shows in the send lag."""
    waited = result(0, 0.0, [0.7, 0.8])
    waited.t_start, waited.t_sent = 0.5, 0.501
    r = build_report([waited], slo=SLO, request_rate=1.0, burstiness=1.0, max_concurrency=1)
    assert r.mean_ttft_ms == pytest.approx(200)
    assert r.send_lag_p50_ms == pytest.approx(501)


def test_usage_token_count_sets_tpot_with_chunked_streams() -> None:
    """Eight tokens in four chunks: TPOT divides by the tokens, ITL is per chunk."""
    r = result(0, 0.0, [0.1, 0.2, 0.3, 0.4], output_tokens=8)
    report = build_report([r], slo=SLO, request_rate=1.0, burstiness=1.0, max_concurrency=None)
    assert report.mean_tpot_ms == pytest.approx(300 / 7)
    assert report.mean_itl_ms == pytest.approx(100)


def test_json_and_text_forms(requests: list[RequestResult]) -> None:
    r = build_report(requests, slo=SLO, request_rate=math.inf, burstiness=0.5, max_concurrency=None)
    doc = json.loads(json.dumps(r.to_dict()))  # strict JSON: no Infinity
    assert doc["request_rate"] == "inf"
    for key in (
        "completed", "failed", "request_throughput", "output_throughput",
        "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
        "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "request_goodput",
        "duration", "max_concurrency", "request_rate", "burstiness",
    ):  # fmt: skip
        assert key in doc, key
    text = format_report(r)
    assert "rate inf req/s (gamma, burstiness 0.5)" in text
    assert "Failed requests:" in text and "(server_error: 1)" in text
    rows = list(csv_rows(math.inf, requests))
    assert [row["success"] for row in rows] == [True, True, True, False]
    assert rows[2]["tpot_ms"] == pytest.approx(300)
    assert rows[3]["ttft_ms"] is None and rows[3]["error_type"] == "server_error"


def test_an_empty_run_reports_zeros() -> None:
    r = build_report([], slo=SLO, request_rate=1.0, burstiness=1.0, max_concurrency=None)
    assert r.completed == 0 and r.request_throughput == 0.0 and r.mean_ttft_ms is None
    assert r.achieved_request_rate is None and r.send_lag_p99_ms is None
