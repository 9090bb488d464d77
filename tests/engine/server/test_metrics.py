"""/metrics parses with prometheus_client's parser and its counters move as requests run."""

from __future__ import annotations

import json
import time

from prometheus_client.parser import text_string_to_metric_families

from tests.engine.server.conftest import TOKEN, ServerThread, request

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _samples(server: ServerThread) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = request("GET", server.url + "/metrics", headers=AUTH)
    assert r.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def test_metrics_parse_and_move(server: ServerThread) -> None:
    before = _samples(server)
    body = {"model": "qwen", "prompt": "hello there", "max_tokens": 6, "ignore_eos": True}
    headers = {**AUTH, "X-Shunter-Tenant": "acme", "X-Shunter-Slo": "class=gold,ttft_ms=60000"}
    data = json.dumps(body).encode()
    r = request("POST", server.url + "/v1/completions", body=data, headers=headers)
    assert r.status_code == 200
    usage = r.json()["usage"]
    after = _samples(server)
    qwen = (("model_name", "qwen"),)

    def moved(name: str, labels: tuple[tuple[str, str], ...] = qwen) -> float:
        return after[(name, labels)] - before.get((name, labels), 0.0)

    assert moved("vllm:prompt_tokens_total") == usage["prompt_tokens"]
    assert moved("vllm:generation_tokens_total") == 6
    assert moved("vllm:time_to_first_token_seconds_count") == 1
    assert moved("vllm:e2e_request_latency_seconds_count") == 1
    assert moved("vllm:request_time_per_output_token_seconds_count") == 1
    assert moved("vllm:inter_token_latency_seconds_count") == 5
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "shunter:num_requests_rotary",
    ):
        assert (name, qwen) in after, name
    acme = (("model_name", "qwen"), ("tenant", "acme"))
    assert moved("shunter:slo_requests_total", acme) == 1
    met = (("model_name", "qwen"), ("target", "ttft"), ("tenant", "acme"))
    assert moved("shunter:slo_met_requests_total", met) == 1
    assert ("shunter:remapped_layers", qwen) in after
    assert ("shunter:rotations_total", ()) in after
    assert ("shunter:kv_swapped_bytes_total", (("direction", "d2h"),)) in after
    # Buckets fine enough for a 100 ms TBT SLO.
    les = {
        float(dict(labels)["le"])
        for name, labels in after
        if name == "vllm:inter_token_latency_seconds_bucket"
    }
    assert {0.05, 0.075, 0.1} <= les


def test_a_scrape_token_opens_metrics_alone_and_open_metrics_needs_none(
    server: ServerThread,
) -> None:
    state = server.state
    scrape = {"Authorization": "Bearer scrape-only"}
    try:
        assert request("GET", server.url + "/metrics", headers=scrape).status_code == 401
        state.metrics_token = "scrape-only"
        assert request("GET", server.url + "/metrics", headers=scrape).status_code == 200
        assert request("GET", server.url + "/metrics", headers=AUTH).status_code == 200
        assert request("GET", server.url + "/v1/models", headers=scrape).status_code == 401
        assert request("GET", server.url + "/admin/state", headers=scrape).status_code == 401
        assert request("GET", server.url + "/metrics").status_code == 401
        state.open_metrics = True
        assert request("GET", server.url + "/metrics").status_code == 200
        assert request("GET", server.url + "/admin/state").status_code == 401
    finally:
        state.metrics_token, state.open_metrics = None, False


def test_gauges_go_back_to_zero_when_the_last_client_leaves(server: ServerThread) -> None:
    """A request aborted while it runs ends with no step after it; the gauges still come
    back to what the state says once the engine is idle."""
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    body = {"model": "qwen", "prompt": "left early", "max_tokens": 1000, "stream": True}
    conn.request(
        "POST",
        "/v1/completions",
        body=json.dumps({**body, "ignore_eos": True}),
        headers={**AUTH, "Content-Type": "application/json"},
    )
    reply = conn.getresponse()
    assert reply.status == 200
    assert reply.readline().startswith(b"data: {")  # it runs
    sample = server.state.metrics.registry.get_sample_value
    qwen = {"model_name": "qwen"}
    # The gauges are set after the step whose token the client may already have read.
    deadline = time.monotonic() + 10
    while sample("vllm:num_requests_running", qwen) != 1:
        assert time.monotonic() < deadline, "the gauge never counted the request"
        time.sleep(0.001)
    conn.close()
    state = server.wait_idle()
    assert state["requests"]["live"] == 0
    assert sample("vllm:num_requests_running", qwen) == 0
    assert sample("vllm:kv_cache_usage_perc", qwen) == state["models"]["qwen"]["kv_usage"]
