"""``X-Shunter-Timing``: a whole (non-streamed) answer carries its token times as the
engine saw them; a stream does not (its chunks are its timing)."""

from __future__ import annotations

import json
import time

import pytest

from shunter.engine.api.timing import TIMING_HEADER, EngineTiming, response_timing
from shunter.engine.config import SloSpec
from shunter.engine.request import Request
from tests.engine.server.conftest import TOKEN, ServerThread, request

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SLO = SloSpec("test", ttft_s=1.0, tbt_s=0.1)


def post(server: ServerThread, path: str, **body: object) -> tuple[dict[str, str], bytes, float]:
    """POST ``body``; the reply's headers, its body and the client's end-to-end ms."""
    started = time.perf_counter()
    r = request("POST", server.url + path, body=json.dumps(body).encode(), headers=AUTH)
    elapsed_ms = 1000 * (time.perf_counter() - started)
    assert r.status_code == 200, r.text
    return r.headers, r.content, elapsed_ms


def timing_of(headers: dict[str, str]) -> EngineTiming:
    timing = EngineTiming.parse(headers.get(TIMING_HEADER))
    assert timing is not None, headers
    return timing


def finished(t_arr: float, times: list[float]) -> Request:
    r = Request(f"r{t_arr}-{len(times)}", "m", 4, 16, SLO, t_arr)
    for t in times:
        r.record_token(t, 1)
    return r


def test_a_whole_completion_carries_its_timing(server: ServerThread) -> None:
    headers, _, client_ms = post(
        server, "/v1/completions", model="llama", prompt="hello", max_tokens=8, ignore_eos=True
    )
    t = timing_of(headers)
    assert t.tpot_ms is not None and t.max_itl_ms is not None
    assert 0 < t.ttft_ms <= t.e2e_ms <= client_ms
    assert 0 < t.tpot_ms <= t.max_itl_ms
    # TPOT leaves out the first token: the seven gaps after it fit between TTFT and e2e.
    assert t.ttft_ms + 7 * t.tpot_ms <= t.e2e_ms + 0.01


def test_a_whole_chat_with_choices_carries_its_timing(server: ServerThread) -> None:
    messages = [{"role": "user", "content": "Which car goes first?"}]
    headers, body, client_ms = post(
        server,
        "/v1/chat/completions",
        model="qwen",
        messages=messages,
        n=2,
        max_tokens=4,
        ignore_eos=True,
    )
    assert len(json.loads(body)["choices"]) == 2
    t = timing_of(headers)
    assert t.tpot_ms is not None and t.max_itl_ms is not None
    assert 0 < t.ttft_ms <= t.e2e_ms <= client_ms and 0 < t.tpot_ms <= t.max_itl_ms


def test_a_one_token_answer_has_no_gap_to_time(server: ServerThread) -> None:
    headers, _, _ = post(server, "/v1/completions", model="llama", prompt="hi", max_tokens=1)
    assert set(headers[TIMING_HEADER].split(",")) == {
        f"ttft_ms={timing_of(headers).ttft_ms:.3f}",
        f"e2e_ms={timing_of(headers).e2e_ms:.3f}",
    }
    assert timing_of(headers).tpot_ms is None and timing_of(headers).max_itl_ms is None


def test_a_stream_has_no_timing_header(server: ServerThread) -> None:
    headers, body, _ = post(
        server, "/v1/completions", model="llama", prompt="hi", max_tokens=4, stream=True
    )
    assert body.rstrip().endswith(b"data: [DONE]")
    assert TIMING_HEADER not in headers


def test_several_choices_report_the_worst_of_each() -> None:
    fast_start_slow_gaps = finished(10.0, [10.1, 10.4, 10.9])  # TPOT 400 ms, ITL 500 ms
    slow_start_fast_gaps = finished(10.0, [10.3, 10.35, 10.4])  # TTFT 300 ms
    one_token = finished(10.0, [10.2])
    t = response_timing([fast_start_slow_gaps, slow_start_fast_gaps, one_token], now=11.0)
    assert t is not None
    assert (t.ttft_ms, t.tpot_ms, t.max_itl_ms, t.e2e_ms) == pytest.approx((300, 400, 500, 1000))
    only = response_timing([one_token], now=10.5)
    assert only == EngineTiming(ttft_ms=pytest.approx(200), e2e_ms=pytest.approx(500))
    assert response_timing([finished(10.0, [])], now=10.5) is None


def test_the_header_reads_back() -> None:
    t = EngineTiming(ttft_ms=12.5, e2e_ms=80.25, tpot_ms=9.125, max_itl_ms=20.0)
    assert t.header() == "ttft_ms=12.500,tpot_ms=9.125,max_itl_ms=20.000,e2e_ms=80.250"
    assert EngineTiming.parse(t.header()) == t
    assert EngineTiming.parse("ttft_ms=1,e2e_ms=2") == EngineTiming(1.0, 2.0)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "ttft_ms=1",
        "e2e_ms=2",
        "ttft_ms=3,e2e_ms=2",
        "ttft_ms=x,e2e_ms=2",
        "ttft_ms=-1,e2e_ms=2",
        "ttft_ms=1,e2e_ms=inf",
        "ttft_ms=1,e2e_ms=2,tpot_ms=nan",
    ],
)
def test_a_malformed_header_is_no_timing(value: str | None) -> None:
    assert EngineTiming.parse(value) is None
