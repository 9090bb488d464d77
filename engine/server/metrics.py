"""Prometheus metrics of one server, in its own registry.

vLLM's names with the ``model_name`` label, so existing dashboards work, and Shunter's
own under ``shunter:``. Latency buckets are fine around 100 ms, the usual TBT SLO.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from shunter.engine.request import Request

# Token gaps: 5 ms steps up to 100 ms, then coarser.
TOKEN_BUCKETS = (
    *(i / 200 for i in range(1, 21)),
    0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
REQUEST_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0,
    4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip
MODEL = ("model_name",)


class ServerMetrics:
    """Every metric of one server; ``render()`` is the ``/metrics`` body."""

    def __init__(self, models: Sequence[str]) -> None:
        self.registry = r = CollectorRegistry()
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token.",
            MODEL,
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Gap between consecutive output tokens.",
            MODEL,
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "vllm:request_time_per_output_token_seconds",
            "(e2e - TTFT) / (output tokens - 1) per request.",
            MODEL,
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Arrival to last token.",
            MODEL,
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.running = Gauge("vllm:num_requests_running", "Requests running.", MODEL, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting.", MODEL, registry=r)
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc",
            "Share of the model's device KV blocks in use (0 to 1).",
            MODEL,
            registry=r,
        )
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions.", MODEL, registry=r)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens admitted.", MODEL, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Output tokens generated.", MODEL, registry=r
        )
        self.requests = Counter(
            "vllm:request_success",
            "Finished requests by finish reason.",
            (*MODEL, "finished_reason"),
            registry=r,
        )
        self.rotary = Gauge(
            "shunter:num_requests_rotary",
            "Requests whose KV is in host memory.",
            MODEL,
            registry=r,
        )
        self.rotations = Counter(
            "shunter:rotations", "Requests swapped back in from host memory.", registry=r
        )
        self.swapped_bytes = Counter(
            "shunter:kv_swapped_bytes",
            "KV bytes copied between device and host.",
            ("direction",),
            registry=r,
        )
        self.remapped_layers = Gauge(
            "shunter:remapped_layers",
            "Decoder layers of the model whose pages hold KV instead of weights.",
            MODEL,
            registry=r,
        )
        self.slo_requests = Counter(
            "shunter:slo_requests",
            "Finished or aborted requests, by model and tenant (SLO attainment's denominator).",
            (*MODEL, "tenant"),
            registry=r,
        )
        self.slo_met = Counter(
            "shunter:slo_met_requests",
            "Requests that met their SLO class's target: ttft, tbt (TPOT) or both.",
            (*MODEL, "tenant", "target"),
            registry=r,
        )
        self.step_seconds = Histogram(
            "shunter:step_duration_seconds",
            "Executor time of one engine step.",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        for model in models:
            for metric in (self.preemptions, self.prompt_tokens, self.generation_tokens):
                metric.labels(model)
        for direction in ("d2h", "h2d"):
            self.swapped_bytes.labels(direction)

    def on_tokens(self, request: Request, first: int) -> None:
        """Account ``request``'s tokens from index ``first`` on (just emitted)."""
        model = request.model
        times = request.token_times
        new = len(times) - first
        if new <= 0:
            return
        self.generation_tokens.labels(model).inc(new)
        if first == 0 and request.ttft is not None:
            self.ttft.labels(model).observe(request.ttft)
        itl = self.itl.labels(model)
        for i in range(max(first, 1), len(times)):
            itl.observe(times[i] - times[i - 1])

    def on_finish(self, request: Request, reason: str, tenant: str) -> None:
        """Account a request that ended (an aborted one misses its SLO)."""
        model = request.model
        self.requests.labels(model, reason).inc()
        self.slo_requests.labels(model, tenant).inc()
        ttft, tpot = request.ttft, request.tpot
        met_ttft = reason != "abort" and ttft is not None and ttft <= request.slo.ttft_s
        # One token has no gap: its TBT target is met.
        met_tbt = reason != "abort" and (tpot is None or tpot <= request.slo.tbt_s)
        for target, met in (("ttft", met_ttft), ("tbt", met_tbt), ("both", met_ttft and met_tbt)):
            if met:
                self.slo_met.labels(model, tenant, target).inc()
        if reason == "abort":
            return
        if request.t_finish is not None:
            self.e2e.labels(model).observe(request.t_finish - request.t_arr)
        if request.tpot is not None:
            self.tpot.labels(model).observe(request.tpot)

    def forget(self, model: str) -> None:
        """Drop the gauges of a model no longer served (counters keep their totals)."""
        for gauge in (self.running, self.waiting, self.kv_usage, self.rotary, self.remapped_layers):
            with contextlib.suppress(KeyError):
                gauge.remove(model)

    def render(self) -> bytes:
        return generate_latest(self.registry)
