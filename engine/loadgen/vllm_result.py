"""``shunter bench serve --save-result``: one rate's run as the JSON document ``vllm
bench serve --save-result`` writes, so a script written for vLLM's results reads ours.

The definitions are vLLM's (vllm-project/vllm, ``vllm/benchmarks/serve.py``,
``calculate_metrics`` and ``benchmark``), over the requests' ``RequestRecord`` views:

- TTFT: from sending to the first streamed text; TPOT: (latency - TTFT) / (output
  tokens - 1), only for requests of two tokens or more; ITL: every gap between streamed
  chunks; E2EL (``latency``): from sending to the last chunk. Successful requests only.
- Each selected metric gets ``mean_*_ms``, ``median_*_ms``, ``std_*_ms`` (population
  standard deviation, numpy's default) and ``p<q>_*_ms`` for each selected percentile,
  0.0 when no request has the value, as vLLM writes them.
- ``max_output_tokens_per_s``: the most chunks streamed in any one-second bucket counted
  from the first successful request's start; ``max_concurrent_requests``: the most
  successful requests in flight at once (half-open intervals, a finish before a start
  at the same instant).
- ``request_goodput``: with ``--goodput``, requests whose every named metric (``ttft``,
  ``tpot``, ``e2el``, milliseconds) is within its value, per second; a request of one
  token counts TPOT 0. Without it, vLLM writes null; we write the goodput of the run's
  SLO (``--ttft-slo-ms``/``--tpot-slo-ms``), which the printed report shows too.

Per-request arrays (``input_lens``, ``output_lens``, ``ttfts``, ``itls``,
``start_times``, ``generated_texts``, ``errors``) are written only with
``--save-detailed``, as vLLM does; ``latencies`` and ``queue_times`` always are.
Shunter's own figures (SLO attainment, the generator's send lag) follow under their own
names. Times in the arrays are seconds, from the run's start.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shunter.engine.loadgen.client import RequestResult
from shunter.engine.sim.metrics import e2e, itls, percentile, std, tpot, ttft

METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")
DEFAULT_PERCENTILES = (99.0,)
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
# What vLLM leaves out of the file without --save-detailed.
DETAILED_FIELDS = (
    "input_lens",
    "output_lens",
    "start_times",
    "ttfts",
    "itls",
    "generated_texts",
    "errors",
)


@dataclass(frozen=True)
class ResultOptions:
    """What the document reports: the metrics with percentiles, which percentiles, the
    goodput SLOs in milliseconds (empty: the run's own SLO) and the per-request arrays."""

    percentile_metrics: tuple[str, ...] = DEFAULT_PERCENTILE_METRICS
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    goodput_ms: Mapping[str, float] | None = None
    detailed: bool = False

    def __post_init__(self) -> None:
        unknown = [m for m in self.percentile_metrics if m not in METRICS]
        if unknown or not self.percentile_metrics:
            raise ValueError(f"percentile metrics must be among {', '.join(METRICS)}: {unknown}")
        if not self.percentiles or any(not 0 <= p <= 100 for p in self.percentiles):
            raise ValueError(f"percentiles must be within 0..100: {list(self.percentiles)}")
        for name, value in (self.goodput_ms or {}).items():
            if name not in GOODPUT_METRICS:
                raise ValueError(
                    f"goodput metric must be one of {', '.join(GOODPUT_METRICS)}, not {name!r}"
                )
            if not value >= 0:
                raise ValueError(f"goodput value of {name} must be a number >= 0 ms: {value}")


def metric_values(results: Sequence[RequestResult]) -> dict[str, list[float]]:
    """Each metric's values in seconds over the successful requests (vLLM's rules)."""
    values: dict[str, list[float]] = {m: [] for m in METRICS}
    for r in results:
        if not r.success:
            continue
        record = r.record()
        first, per_token, whole = ttft(record), tpot(record), e2e(record)
        if first is not None:
            values["ttft"].append(first)
        if per_token is not None:
            values["tpot"].append(per_token)
        if whole is not None:
            values["e2el"].append(whole)
        values["itl"].extend(itls(record))
    return values


def statistics(
    name: str, values_s: Sequence[float], percentiles: Sequence[float]
) -> dict[str, float]:
    """``mean_``, ``median_``, ``std_`` and ``p<q>_`` of ``name`` in milliseconds."""
    if not values_s:
        values_s = [0.0]
    out = {
        f"mean_{name}_ms": math.fsum(values_s) / len(values_s) * 1000.0,
        f"median_{name}_ms": _at(values_s, 50.0) * 1000.0,
        f"std_{name}_ms": (std(values_s) or 0.0) * 1000.0,
    }
    for q in percentiles:
        out[f"p{percentile_word(q)}_{name}_ms"] = _at(values_s, q) * 1000.0
    return out


def percentile_word(q: float) -> str:
    """``99`` for 99.0, ``99.9`` for 99.9: how vLLM names a percentile's field."""
    return str(int(q)) if int(q) == q else str(q)


def _at(values: Sequence[float], q: float) -> float:
    value = percentile(values, q)
    return 0.0 if value is None else value


def peak_output_rate(results: Sequence[RequestResult]) -> float:
    """The most streamed chunks in one second, in buckets from the first start."""
    ok = [r for r in results if r.success and r.t_start is not None]
    if not ok:
        return 0.0
    origin = min(r.t_start for r in ok if r.t_start is not None)
    buckets: dict[int, int] = {}
    for r in ok:
        for t in r.token_times:
            second = int(t - origin)
            buckets[second] = buckets.get(second, 0) + 1
    return float(max(buckets.values(), default=0))


def peak_concurrency(results: Sequence[RequestResult]) -> int:
    """The most successful requests in flight at once."""
    events: list[tuple[float, int]] = []
    for r in results:
        if r.success and r.t_start is not None:
            end = r.token_times[-1] if r.token_times else r.t_end
            if end is not None:
                events += [(r.t_start, 1), (end, -1)]
    peak = now = 0
    for _, delta in sorted(events):
        now += delta
        peak = max(peak, now)
    return peak


def good_requests(results: Sequence[RequestResult], goodput_ms: Mapping[str, float]) -> int:
    """Successful requests within every SLO of ``goodput_ms`` (vLLM's ``--goodput``)."""
    good = 0
    for r in results:
        if not r.success:
            continue
        record = r.record()
        seen = {"ttft": ttft(record), "tpot": tpot(record) or 0.0, "e2el": e2e(record)}
        if all(
            (value := seen[name]) is not None and value * 1000.0 <= limit
            for name, limit in goodput_ms.items()
        ):
            good += 1
    return good


def result_document(
    header: Mapping[str, Any],
    report: Mapping[str, Any],
    results: Sequence[RequestResult],
    options: ResultOptions,
) -> dict[str, Any]:
    """The document for one rate: ``header`` (date, backend, label, model, metadata,
    traffic), vLLM's result fields from ``results``, then the rest of ``report`` (the
    ``RateReport``'s dict) under names vLLM does not use."""
    values = metric_values(results)
    duration = max(float(report["duration"]), 1e-9)
    goodput = report["request_goodput"]
    if options.goodput_ms:
        goodput = good_requests(results, options.goodput_ms) / duration
    doc: dict[str, Any] = dict(header)
    doc.update(
        duration=report["duration"],
        completed=report["completed"],
        failed=report["failed"],
        total_input_tokens=report["total_input_tokens"],
        total_output_tokens=report["total_output_tokens"],
        request_throughput=report["request_throughput"],
        request_goodput=goodput,
        output_throughput=report["output_throughput"],
        total_token_throughput=report["total_token_throughput"],
        input_lens=[r.input_tokens for r in results],
        output_lens=[r.output_tokens if r.success else 0 for r in results],
        ttfts=[(ttft(r.record()) or 0.0) if r.success else 0.0 for r in results],
        itls=[itls(r.record()) if r.success else [] for r in results],
        latencies=[(e2e(r.record()) or 0.0) if r.success else 0.0 for r in results],
        start_times=[r.t_start for r in results],
        queue_times=[None if r.t_start is None else r.t_start - r.t_scheduled for r in results],
        generated_texts=[r.generated_text for r in results],
        errors=[r.error or "" for r in results],
        max_output_tokens_per_s=peak_output_rate(results),
        max_concurrent_requests=peak_concurrency(results),
    )
    for name in options.percentile_metrics:
        doc.update(statistics(name, values[name], options.percentiles))
    if options.goodput_ms:
        doc["goodput_slos_ms"] = dict(options.goodput_ms)
    if not options.detailed:
        for name in DETAILED_FIELDS:
            del doc[name]
    for key, value in report.items():
        if key not in DETAILED_FIELDS:
            doc.setdefault(key, value)
    return doc


def result_filename(
    label: str, rate: float, max_concurrency: int | None, model_id: str, date: str
) -> str:
    """vLLM's file name: ``{label}-{rate}qps[-concurrency{n}]-{model}-{date}.json``."""
    concurrency = "" if max_concurrency is None else f"-concurrency{max_concurrency}"
    model = model_id.rstrip("/").split("/")[-1]
    return f"{label}-{float(rate)}qps{concurrency}-{model}-{date}.json"
