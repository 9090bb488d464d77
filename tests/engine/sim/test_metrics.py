import pytest

from shunter.engine.sim.metrics import (
    RequestRecord,
    e2e,
    itls,
    meets_tbt,
    meets_ttft,
    percentile,
    summarize,
    tpot,
    ttft,
)


def rec(arrival: float, times: list[float], success: bool = True) -> RequestRecord:
    return RequestRecord.from_token_times(arrival, times, success=success)


def test_ttft_tpot_and_itl_of_one_request() -> None:
    r = rec(1.0, [1.5, 1.6, 1.8, 2.1])
    assert ttft(r) == pytest.approx(0.5)
    # (e2e - TTFT) / (n - 1) = (1.1 - 0.5) / 3
    assert tpot(r) == pytest.approx(0.2)
    assert itls(r) == pytest.approx([0.1, 0.2, 0.3])
    assert e2e(r) == pytest.approx(1.1)


def test_single_token_request_has_no_tpot_and_meets_tbt() -> None:
    r = rec(0.0, [0.3])
    assert tpot(r) is None
    assert meets_tbt(r, 0.1)
    assert meets_ttft(r, 0.3) and not meets_ttft(r, 0.29)


def test_failed_requests_miss_both_slos() -> None:
    failed = rec(0.0, [0.1, 0.15], success=False)
    assert not meets_ttft(failed, 5.0)
    assert not meets_tbt(failed, 5.0)
    no_tokens = RequestRecord(0.0, None, None, 0, success=False)
    assert ttft(no_tokens) is None and not meets_tbt(no_tokens, 1.0)


def test_summary_on_hand_built_records() -> None:
    records = [
        rec(0.0, [1.0, 1.05, 1.10]),  # meets both (TTFT 1.0, TPOT 0.05)
        rec(0.0, [6.0, 6.05]),  # misses TTFT, meets TBT
        rec(1.0, [2.0, 2.5, 3.0]),  # meets TTFT, misses TBT (TPOT 0.5)
        rec(2.0, [2.5, 2.6], success=False),  # aborted: misses both
    ]
    s = summarize(records, ttft_slo_s=5.0, tbt_slo_s=0.1, duration_s=10.0)
    assert s.num_requests == 4 and s.num_succeeded == 3
    assert s.ttft_attainment == pytest.approx(0.5)
    assert s.tbt_attainment == pytest.approx(0.5)
    assert s.slo_attainment == pytest.approx(0.25)
    assert s.goodput == pytest.approx(0.1)
    assert s.throughput_tok_s == pytest.approx(0.8)  # 8 tokens of succeeded requests
    assert s.ttft_s.p50 == pytest.approx(1.0)
    assert s.tpot_s.p99 == pytest.approx(percentile([0.05, 0.05, 0.5], 99))
    # Gaps of succeeded requests: 0.05, 0.05, 0.05, 0.5, 0.5 -> 3 of 5 within 0.1 s.
    assert s.itl_within_tbt == pytest.approx(0.6)
    assert s.itl_s.p50 == pytest.approx(0.05)
    assert s.itl_s.mean == pytest.approx(1.15 / 5)
    assert s.request_throughput == pytest.approx(0.3)
    assert s.num_output_tokens == 8
    # E2E of succeeded requests: 1.10, 6.05, 2.0.
    assert s.e2e_s.mean == pytest.approx(9.15 / 3)
    assert s.e2e_s.p50 == pytest.approx(2.0)
    assert s.ttft_s.mean == pytest.approx(8.0 / 3)  # TTFTs 1.0, 6.0, 1.0


def test_percentile_matches_linear_interpolation() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile([], 50) is None


def test_empty_run_summarizes_to_zeros() -> None:
    s = summarize([], ttft_slo_s=1.0, tbt_slo_s=0.1, duration_s=1.0)
    assert s.slo_attainment == 0.0 and s.ttft_s.p99 is None and s.itl_within_tbt is None
    assert s.ttft_s.mean is None and s.e2e_s.p50 is None and s.request_throughput == 0.0
    with pytest.raises(ValueError):
        summarize([], ttft_slo_s=1.0, tbt_slo_s=0.1, duration_s=0.0)
