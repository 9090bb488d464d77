"""A Shunter engine answers the queries of vLLM's stock Grafana dashboard.

``DASHBOARD_SERIES`` lists, in our words, the series the panels of vLLM's example
dashboard (``examples/online_serving/prometheus_grafana/grafana.json``) query: E2E
latency, token throughput, time per output token, scheduler state, TTFT, cache use,
prompt and generation length heatmaps, finish reasons, queue time, prefill and decode
time, and max generation tokens."""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from tests.engine.server.conftest import TOKEN, ServerThread, request

AUTH = {"Authorization": f"Bearer {TOKEN}"}

HISTOGRAMS = (
    "vllm:e2e_request_latency_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:time_to_first_token_seconds",
)
DASHBOARD_SERIES = (
    *(f"{name}_{part}" for name in HISTOGRAMS for part in ("bucket", "sum", "count")),
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:gpu_cache_usage_perc",
    "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket",
    "vllm:request_success_total",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
)
# The rest of vLLM's v1 set (PrometheusStatLogger), read by its production-stack
# dashboards and by operators' own queries.
MORE_SERIES = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:iteration_tokens_total_bucket",
    "vllm:request_params_n_bucket",
    "vllm:request_params_max_tokens_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:request_time_per_output_token_seconds_bucket",
    "vllm:request_inference_time_seconds_bucket",
    "vllm:time_per_prefill_token_request_seconds_bucket",
    "vllm:cache_config_info",
)
# What the engine-side panels of vllm-project/production-stack's dashboard
# (observability/vllm-dashboard.json) read beyond the stock set. Its other panels read
# its router (vllm:healthy_pods_total, vllm:current_qps) and node-exporter recording
# rules.
PRODUCTION_STACK_SERIES = (
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:time_per_output_token_seconds_sum",
    "vllm:time_per_output_token_seconds_count",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_swapped",
    "vllm:gpu_cache_usage_perc",
    "vllm:gpu_prefix_cache_hit_rate",
)


def test_every_series_the_dashboard_queries_exists_for_a_served_model(
    server: ServerThread,
) -> None:
    body = {"model": "qwen", "prompt": "hello there", "max_tokens": 4, "ignore_eos": True}
    r = request(
        "POST", server.url + "/v1/completions", body=json.dumps(body).encode(), headers=AUTH
    )
    assert r.status_code == 200
    text = request("GET", server.url + "/metrics", headers=AUTH).text
    families = list(text_string_to_metric_families(text))
    served = {s.name for f in families for s in f.samples if s.labels.get("model_name") == "qwen"}
    wanted = (*DASHBOARD_SERIES, *MORE_SERIES, *PRODUCTION_STACK_SERIES)
    missing = [name for name in wanted if name not in served]
    assert not missing, missing
    # A request's phases add up: queue, prefill and decode time were observed once each.
    counts = {
        s.name: s.value
        for f in families
        for s in f.samples
        if s.labels.get("model_name") == "qwen" and s.name.endswith("_count")
    }
    for phase in ("queue", "prefill", "decode", "inference"):
        assert counts[f"vllm:request_{phase}_time_seconds_count"] >= 1, phase
    types = {f.name: f.type for f in families}
    assert types["vllm:time_to_first_token_seconds"] == "histogram"
    assert types["vllm:num_requests_running"] == "gauge"
    assert types["vllm:prompt_tokens"] == "counter"
    assert not [line for line in text.splitlines() if "_created" in line]
    (info,) = [
        s
        for f in families
        for s in f.samples
        if s.name == "vllm:cache_config_info"
        if s.labels["model_name"] == "qwen"
    ]
    assert int(info.labels["block_size"]) > 0 and int(info.labels["num_gpu_blocks"]) > 0
