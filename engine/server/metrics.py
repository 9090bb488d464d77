"""Prometheus metrics of one server, in its own registry.

vLLM's metric set (``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger``): the same
names, types, buckets and the ``model_name`` label, so vLLM's Grafana dashboard and the
production stack's read a Shunter engine as they read vLLM; the deprecated names the
stock dashboard still queries (``vllm:gpu_cache_usage_perc``,
``vllm:time_per_output_token_seconds``) are kept beside their successors. Shunter's own
metrics are under ``shunter:``. No ``_created`` series (vLLM disables them too).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from shunter.engine import latency
from shunter.engine.memory.prefix import PrefixStats
from shunter.engine.request import Request

disable_created_metrics()  # type: ignore[no-untyped-call]

# vLLM's buckets (PrometheusStatLogger): time to first token, time per output token
# (and each token gap), request phases.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
PREFILL_TOKEN_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)
# Shunter's step times: 5 ms steps up to 100 ms (the usual TBT target), then coarser.
STEP_BUCKETS = (
    *(i / 200 for i in range(1, 21)),
    0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
MODEL = ("model_name",)


def count_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's ``build_1_2_5_buckets``),
    for token counts up to a model's context length."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10


# Token-count buckets reach past the longest context of any preset (131,072 tokens).
CONTEXT_LIMIT = 1 << 20
CACHE_INFO = (
    "block_size",
    "num_gpu_blocks",
    "num_cpu_blocks",
    "cache_dtype",
    "enable_prefix_caching",
)


class ServerMetrics:
    """Every metric of one server; ``render()`` is the ``/metrics`` body."""

    def __init__(self, models: Sequence[str]) -> None:
        self.registry = r = CollectorRegistry()

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, MODEL, buckets=buckets, registry=r)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, MODEL, registry=r)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, MODEL, registry=r)

        counts = count_buckets(CONTEXT_LIMIT)
        # Scheduler state and cache.
        self.running = gauge("vllm:num_requests_running", "Requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be processed.")
        # vLLM's V0 name for requests whose KV went to host memory: ours are the rotary
        # ones (production-stack's dashboard still reads it).
        self.swapped = gauge("vllm:num_requests_swapped", "Requests swapped to host memory.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent.")
        self.gpu_cache_usage = gauge(
            "vllm:gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent. DEPRECATED: vllm:kv_cache_usage_perc.",
        )
        self.cache_info = Gauge(
            "vllm:cache_config_info",
            "Information of the model's KV cache configuration (always 1).",
            (*MODEL, *CACHE_INFO),
            registry=r,
        )
        self._cache_labels: dict[str, tuple[str, ...]] = {}
        # Counters.
        self.preemptions = counter("vllm:num_preemptions", "Preemptions from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generation tokens processed.")
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.prefix_host_hits = counter(
            "shunter:prefix_cache_host_hits",
            "Prefix cache hits found in host memory (copied in, not recomputed), in tokens.",
        )
        # vLLM V0's name for the share of queried tokens found cached (production-stack's
        # dashboard reads it).
        self.prefix_hit_rate = gauge(
            "vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate."
        )
        self._prefix_seen: dict[str, tuple[int, int, int]] = {}
        self.requests = Counter(
            "vllm:request_success",
            "Finished requests by finish reason.",
            (*MODEL, "finished_reason"),
            registry=r,
        )
        # Histograms of counts.
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Prefill tokens of a finished request.", counts
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Generation tokens of a finished request.", counts
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total", "Tokens of the model per engine step.", ITERATION_BUCKETS
        )
        self.max_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Generation tokens of a finished request (each choice is one request).",
            counts,
        )
        self.params_n = histogram(
            "vllm:request_params_n", "Sequences one HTTP request asked for.", N_BUCKETS
        )
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens", "The max_tokens request parameter.", counts
        )
        # Histograms of times.
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Gap between consecutive tokens.", TOKEN_BUCKETS
        )
        self.time_per_output_token = histogram(
            "vllm:time_per_output_token_seconds",
            "Gap between consecutive tokens. DEPRECATED: vllm:inter_token_latency_seconds.",
            TOKEN_BUCKETS,
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "(e2e - TTFT) / (output tokens - 1) per request.",
            TOKEN_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Arrival to last token.", REQUEST_BUCKETS
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Time in the WAITING phase.", REQUEST_BUCKETS
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Time from first scheduled to finished.",
            REQUEST_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Time from first scheduled to first token.",
            REQUEST_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Time from first token to finished.",
            REQUEST_BUCKETS,
        )
        self.prefill_token_time = histogram(
            "vllm:time_per_prefill_token_request_seconds",
            "Prefill time per prompt token.",
            PREFILL_TOKEN_BUCKETS,
        )
        # Shunter's own.
        self.rotary = gauge("shunter:num_requests_rotary", "Requests whose KV is in host memory.")
        self.rotations = Counter(
            "shunter:rotations", "Requests swapped back in from host memory.", registry=r
        )
        self.swapped_bytes = Counter(
            "shunter:kv_swapped_bytes",
            "KV bytes copied between device and host.",
            ("direction",),
            registry=r,
        )
        self.remapped_layers = gauge(
            "shunter:remapped_layers",
            "Decoder layers of the model whose pages hold KV instead of weights.",
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
            buckets=STEP_BUCKETS,
            registry=r,
        )
        for model in models:
            for metric in (self.preemptions, self.prompt_tokens, self.generation_tokens):
                metric.labels(model)
        for direction in ("d2h", "h2d"):
            self.swapped_bytes.labels(direction)

    def on_request(self, model: str, sequences: int, max_tokens: int) -> None:
        """Account an HTTP request of ``sequences`` sequences as it is submitted."""
        self.params_n.labels(model).observe(sequences)
        self.params_max_tokens.labels(model).observe(max_tokens)

    def on_queues(self, model: str, *, running: int, waiting: int, rotary: int, kv: float) -> None:
        """A model's requests by state and its KV usage after a step."""
        self.running.labels(model).set(running)
        self.waiting.labels(model).set(waiting)
        self.swapped.labels(model).set(rotary)
        self.rotary.labels(model).set(rotary)
        self.kv_usage.labels(model).set(kv)
        self.gpu_cache_usage.labels(model).set(kv)

    def on_cache(
        self,
        model: str,
        *,
        block_size: int,
        gpu_blocks: int,
        cpu_blocks: int,
        dtype: str,
        prefix_caching: bool,
    ) -> None:
        """The model's KV cache as configured now (its info series is replaced)."""
        labels = (
            model,
            str(block_size),
            str(gpu_blocks),
            str(cpu_blocks),
            dtype,
            str(prefix_caching),
        )
        old = self._cache_labels.get(model)
        if old == labels:
            return
        if old is not None:
            self.cache_info.remove(*old)
        self.cache_info.labels(*labels).set(1)
        self._cache_labels[model] = labels

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
        itl, per_token = self.itl.labels(model), self.time_per_output_token.labels(model)
        for i in range(max(first, 1), len(times)):
            gap = times[i] - times[i - 1]
            itl.observe(gap)
            per_token.observe(gap)

    def on_finish(self, request: Request, reason: str, tenant: str) -> None:
        """Account a request that ended (an aborted one misses its SLO)."""
        model = request.model
        self.requests.labels(model, reason).inc()
        self.slo_requests.labels(model, tenant).inc()
        success = reason != "abort"
        tokens = request.num_output_tokens
        met_ttft = latency.ttft_met(
            success=success, ttft_s=request.ttft, target_s=request.slo.ttft_s
        )
        met_tbt = latency.tbt_met(
            success=success, tokens=tokens, tpot_s=request.tpot, target_s=request.slo.tbt_s
        )
        for target, met in (("ttft", met_ttft), ("tbt", met_tbt), ("both", met_ttft and met_tbt)):
            if met:
                self.slo_met.labels(model, tenant, target).inc()
        if not success:
            return
        self.request_prompt_tokens.labels(model).observe(request.prompt_tokens)
        self.request_generation_tokens.labels(model).observe(tokens)
        self.max_generation_tokens.labels(model).observe(tokens)
        end, first, scheduled = request.t_finish, request.t_first_token, request.t_scheduled
        if end is not None:
            self.e2e.labels(model).observe(end - request.t_arr)
        if request.tpot is not None:
            self.tpot.labels(model).observe(request.tpot)
        if scheduled is None:
            return
        self.queue_time.labels(model).observe(scheduled - request.t_arr)
        if end is not None:
            self.inference_time.labels(model).observe(end - scheduled)
        if first is not None:
            prefill = first - scheduled
            self.prefill_time.labels(model).observe(prefill)
            self.prefill_token_time.labels(model).observe(prefill / request.prompt_tokens)
            if end is not None:
                self.decode_time.labels(model).observe(end - first)

    def on_prefix_cache(self, stats: PrefixStats) -> None:
        """The prefix cache's totals since the engine started (the counters grow by
        what is new)."""
        for model, queried in stats.queries.items():
            hit, host = stats.hits.get(model, 0), stats.host_hits.get(model, 0)
            seen_queries, seen_hits, seen_host = self._prefix_seen.get(model, (0, 0, 0))
            if queried > seen_queries:
                self.prefix_queries.labels(model).inc(queried - seen_queries)
                self.prefix_hits.labels(model).inc(hit - seen_hits)
                self.prefix_host_hits.labels(model).inc(host - seen_host)
                self.prefix_hit_rate.labels(model).set(hit / queried)
                self._prefix_seen[model] = (queried, hit, host)

    def on_step(self, duration_s: float, tokens_by_model: dict[str, int]) -> None:
        self.step_seconds.observe(duration_s)
        for model, tokens in tokens_by_model.items():
            self.iteration_tokens.labels(model).observe(tokens)

    def forget(self, model: str) -> None:
        """Drop the gauges of a model no longer served (counters keep their totals)."""
        gauges = (
            self.running,
            self.waiting,
            self.swapped,
            self.kv_usage,
            self.gpu_cache_usage,
            self.rotary,
            self.remapped_layers,
            self.prefix_hit_rate,
        )
        for gauge in gauges:
            with contextlib.suppress(KeyError):
                gauge.remove(model)
        old = self._cache_labels.pop(model, None)
        if old is not None:
            self.cache_info.remove(*old)

    def render(self) -> bytes:
        return generate_latest(self.registry)
