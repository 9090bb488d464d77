"""``vllm_result``: vLLM's result fields from hand-built requests, checked against numpy's
statistics and hand counts."""

from __future__ import annotations

import numpy as np
import pytest

from shunter.engine.loadgen.client import RequestResult
from shunter.engine.loadgen.vllm_result import (
    ResultOptions,
    good_requests,
    metric_values,
    peak_concurrency,
    peak_output_rate,
    result_document,
    result_filename,
    statistics,
)


def done(index: int, start: float, times: list[float], tokens: int | None = None) -> RequestResult:
    r = RequestResult(
        index, t_scheduled=start - 0.01, input_tokens=10 + index, expected_output_tokens=4
    )
    r.t_start, r.t_end = start, times[-1] + 0.001
    r.token_times = list(times)
    r.text = [f"t{i}" for i in range(len(times))]
    r.output_tokens = len(times) if tokens is None else tokens
    r.success = True
    return r


def failed(index: int, start: float) -> RequestResult:
    r = RequestResult(index, t_scheduled=start, input_tokens=5, expected_output_tokens=4)
    r.t_start, r.t_end = start, start + 0.5
    r.fail("http_500", "boom")
    return r


REQUESTS = [
    done(0, 0.0, [0.1, 0.2, 0.4]),  # TTFT 0.1, TPOT 0.15, ITLs 0.1 0.2, E2EL 0.4
    done(1, 0.5, [0.8, 1.3]),  # TTFT 0.3, TPOT 0.5, ITL 0.5, E2EL 0.8
    done(2, 1.2, [1.25]),  # one token: no TPOT, no ITL
    failed(3, 0.2),
]


def test_metric_values_follow_vllms_definitions() -> None:
    values = metric_values(REQUESTS)
    assert values["ttft"] == pytest.approx([0.1, 0.3, 0.05])
    assert values["tpot"] == pytest.approx([0.15, 0.5])
    assert values["itl"] == pytest.approx([0.1, 0.2, 0.5])
    assert values["e2el"] == pytest.approx([0.4, 0.8, 0.05])


def test_statistics_equal_numpys() -> None:
    values = [0.1, 0.3, 0.05, 0.7, 0.2]
    stats = statistics("ttft", values, [50, 90, 99.9])
    assert stats["mean_ttft_ms"] == pytest.approx(np.mean(values) * 1000)
    assert stats["median_ttft_ms"] == pytest.approx(np.median(values) * 1000)
    assert stats["std_ttft_ms"] == pytest.approx(np.std(values) * 1000)
    assert stats["p90_ttft_ms"] == pytest.approx(np.percentile(values, 90) * 1000)
    assert stats["p99.9_ttft_ms"] == pytest.approx(np.percentile(values, 99.9) * 1000)
    assert statistics("itl", [], [99]) == {
        "mean_itl_ms": 0.0,
        "median_itl_ms": 0.0,
        "std_itl_ms": 0.0,
        "p99_itl_ms": 0.0,
    }


def test_peaks_count_chunks_per_second_and_requests_in_flight() -> None:
    # Chunks in second 0: 0.1 0.2 0.4 0.8 (4); second 1: 1.3 1.25 (2).
    assert peak_output_rate(REQUESTS) == 4.0
    # 0..0.4 and 0.5..1.3 overlap nothing; 1.2..1.25 overlaps the second.
    assert peak_concurrency(REQUESTS) == 2
    back_to_back = [done(0, 0.0, [0.5]), done(1, 0.5, [1.0])]
    assert peak_concurrency(back_to_back) == 1  # a finish before a start at one instant
    assert peak_output_rate([failed(0, 0.0)]) == 0.0 and peak_concurrency([]) == 0


def test_goodput_counts_requests_within_every_named_slo() -> None:
    assert good_requests(REQUESTS, {"ttft": 200}) == 2
    assert good_requests(REQUESTS, {"ttft": 400, "tpot": 200}) == 2  # one token: TPOT 0
    assert good_requests(REQUESTS, {"e2el": 100}) == 1
    assert good_requests(REQUESTS, {}) == 3  # every success


def test_the_document_has_vllms_fields_and_per_request_arrays_only_when_detailed() -> None:
    header = {"date": "20261128-120000", "backend": "openai", "request_rate": 4.0}
    report = {
        "duration": 2.0,
        "completed": 3,
        "failed": 1,
        "total_input_tokens": 33,
        "total_output_tokens": 6,
        "request_throughput": 1.5,
        "request_goodput": 0.5,
        "output_throughput": 3.0,
        "total_token_throughput": 19.5,
        "errors": ["", "", "", "http_500: boom"],
        "slo_attainment": 0.25,
        "mean_ttft_ms": 150.0,
    }
    options = ResultOptions(("ttft", "e2el"), (50.0, 99.0), {"ttft": 200.0}, detailed=True)
    doc = result_document(header, report, REQUESTS, options)
    assert doc["date"] == "20261128-120000" and doc["request_rate"] == 4.0
    assert doc["request_goodput"] == pytest.approx(1.0)  # 2 good requests in 2 s
    assert doc["input_lens"] == [10, 11, 12, 5] and doc["output_lens"] == [3, 2, 1, 0]
    assert doc["ttfts"] == pytest.approx([0.1, 0.3, 0.05, 0.0])
    assert doc["itls"][0] == pytest.approx([0.1, 0.2]) and doc["itls"][3] == []
    assert doc["generated_texts"][1] == "t0t1" and doc["errors"][3] == "boom"
    assert doc["latencies"] == pytest.approx([0.4, 0.8, 0.05, 0.0])
    assert doc["queue_times"] == pytest.approx([0.01, 0.01, 0.01, 0.0])
    assert doc["max_output_tokens_per_s"] == 4.0 and doc["max_concurrent_requests"] == 2
    assert doc["mean_ttft_ms"] == pytest.approx(150.0)
    assert {"p50_ttft_ms", "p99_ttft_ms", "std_e2el_ms", "p50_e2el_ms"} <= doc.keys()
    assert "mean_tpot_ms" not in doc and doc["slo_attainment"] == 0.25
    brief = result_document(header, report, REQUESTS, ResultOptions())
    for name in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"):
        assert name not in brief
    assert brief["request_goodput"] == 0.5  # the run's own SLO without --goodput
    assert {"std_ttft_ms", "p99_tpot_ms", "median_itl_ms", "latencies"} <= brief.keys()


def test_bad_options_and_vllms_file_name() -> None:
    for bad in (
        {"percentile_metrics": ("ttft", "latency")},
        {"percentiles": (101.0,)},
        {"goodput_ms": {"itl": 5.0}},
        {"goodput_ms": {"ttft": -1.0}},
    ):
        with pytest.raises(ValueError):
            ResultOptions(**bad)  # type: ignore[arg-type]
    assert (
        result_filename("openai", 4, None, "org/Llama-3", "20261128-120000")
        == "openai-4.0qps-Llama-3-20261128-120000.json"
    )
    assert result_filename("x", float("inf"), 8, "m", "d") == "x-infqps-concurrency8-m-d.json"
