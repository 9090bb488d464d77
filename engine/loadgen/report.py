"""A rate's report from its requests: ``vllm bench serve`` field names, Shunter's SLO
attainment beside them, a printed block and per-request CSV rows.

The metrics are ``shunter.engine.sim.metrics.summarize``'s (the simulator's), over the
requests' ``RequestRecord`` views, so a simulated and a measured run are scored alike.
Throughputs and goodput are per second of the run: from its start to the last request's
end, as ``vllm bench serve`` takes its duration.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shunter.engine.loadgen.client import RequestResult
from shunter.engine.loadgen.vllm_result import peak_concurrency, peak_output_rate
from shunter.engine.sim.metrics import Percentiles, e2e, percentile, summarize, tpot, ttft


@dataclass(frozen=True)
class Slo:
    """The SLO class requests are scored against: TTFT <= ``ttft_s`` and TPOT <=
    ``tpot_s`` (ARCHITECTURE.md; defaults are the engine's: 5 s and 100 ms)."""

    ttft_s: float = 5.0
    tpot_s: float = 0.1

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise ValueError("SLOs must be positive")


@dataclass(frozen=True)
class RateReport:
    """Metrics of one rate's run. Field names follow ``vllm bench serve --save-result``
    where they overlap; latencies are milliseconds, None when no request has the value.

    ``request_rate`` is the arrival rate asked for (inf: all at once; a trace replayed as
    recorded gives its own mean rate); ``burstiness`` is None for a trace.
    ``ttft_attainment``, ``tbt_attainment`` and ``slo_attainment`` are shares of all
    requests (failed ones miss); ``request_goodput`` is requests meeting both per second;
    ``itl_within_tbt`` the share of inter-token gaps <= the TPOT SLO. ``send_lag_*_ms``
    is the generator's own timing error (headers sent minus scheduled time), and
    ``achieved_request_rate`` the rate at which requests actually went out. ``errors``
    is one string per request in schedule order, empty for a success (as vLLM writes
    it); ``error_counts`` counts the failures by kind.
    """

    request_rate: float
    burstiness: float | None
    max_concurrency: int | None
    num_prompts: int
    duration: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float
    output_throughput: float
    total_token_throughput: float
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    p90_ttft_ms: float | None
    p99_ttft_ms: float | None
    mean_tpot_ms: float | None
    median_tpot_ms: float | None
    p90_tpot_ms: float | None
    p99_tpot_ms: float | None
    mean_itl_ms: float | None
    median_itl_ms: float | None
    p90_itl_ms: float | None
    p99_itl_ms: float | None
    mean_e2el_ms: float | None
    median_e2el_ms: float | None
    p90_e2el_ms: float | None
    p99_e2el_ms: float | None
    std_ttft_ms: float | None
    std_tpot_ms: float | None
    std_itl_ms: float | None
    std_e2el_ms: float | None
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    ttft_slo_ms: float
    tpot_slo_ms: float
    ttft_attainment: float
    tbt_attainment: float
    slo_attainment: float
    itl_within_tbt: float | None
    errors: list[str]
    error_counts: dict[str, int]
    achieved_request_rate: float | None
    send_lag_p50_ms: float | None
    send_lag_p90_ms: float | None
    send_lag_p99_ms: float | None
    send_lag_max_ms: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: an infinite rate is written ``"inf"``, as vLLM writes it."""
        out = asdict(self)
        if math.isinf(self.request_rate):
            out["request_rate"] = "inf"
        return out


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def _latency(name: str, p: Percentiles) -> dict[str, float | None]:
    return {
        f"mean_{name}_ms": _ms(p.mean),
        f"median_{name}_ms": _ms(p.p50),
        f"p90_{name}_ms": _ms(p.p90),
        f"p99_{name}_ms": _ms(p.p99),
        f"std_{name}_ms": _ms(p.std),
    }


def build_report(
    results: Sequence[RequestResult],
    *,
    slo: Slo,
    request_rate: float,
    burstiness: float | None,
    max_concurrency: int | None,
    duration_s: float | None = None,
) -> RateReport:
    """Score ``results`` (times from the run's start) against ``slo``. ``duration_s``
    defaults to the end of the last request."""
    if duration_s is None:
        ends = [t for r in results if (t := r.t_end) is not None]
        duration_s = max(ends, default=0.0)
    duration_s = max(duration_s, 1e-9)  # a run of nothing still divides
    summary = summarize(
        [r.record() for r in results],
        ttft_slo_s=slo.ttft_s,
        tbt_slo_s=slo.tpot_s,
        duration_s=duration_s,
    )
    ok = [r for r in results if r.success]
    input_tokens = sum(r.input_tokens for r in ok)
    sent = sorted(t for r in results if (t := r.t_sent) is not None)
    lags = [lag for r in results if (lag := r.send_lag) is not None]
    return RateReport(
        request_rate=request_rate,
        burstiness=burstiness,
        max_concurrency=max_concurrency,
        num_prompts=len(results),
        duration=duration_s,
        completed=summary.num_succeeded,
        failed=summary.num_requests - summary.num_succeeded,
        total_input_tokens=input_tokens,
        total_output_tokens=summary.num_output_tokens,
        request_throughput=summary.request_throughput,
        request_goodput=summary.goodput,
        output_throughput=summary.throughput_tok_s,
        total_token_throughput=(input_tokens + summary.num_output_tokens) / duration_s,
        **_latency("ttft", summary.ttft_s),
        **_latency("tpot", summary.tpot_s),
        **_latency("itl", summary.itl_s),
        **_latency("e2el", summary.e2e_s),
        max_output_tokens_per_s=peak_output_rate(results),
        max_concurrent_requests=peak_concurrency(results),
        ttft_slo_ms=slo.ttft_s * 1000.0,
        tpot_slo_ms=slo.tpot_s * 1000.0,
        ttft_attainment=summary.ttft_attainment,
        tbt_attainment=summary.tbt_attainment,
        slo_attainment=summary.slo_attainment,
        itl_within_tbt=summary.itl_within_tbt,
        errors=[_error(r) for r in results],
        error_counts=dict(Counter(r.error_type or "unknown" for r in results if not r.success)),
        achieved_request_rate=(
            (len(sent) - 1) / (sent[-1] - sent[0]) if len(sent) > 1 and sent[-1] > sent[0] else None
        ),
        send_lag_p50_ms=_ms(percentile(lags, 50)),
        send_lag_p90_ms=_ms(percentile(lags, 90)),
        send_lag_p99_ms=_ms(percentile(lags, 99)),
        send_lag_max_ms=_ms(max(lags, default=None)),
    )


def _error(result: RequestResult) -> str:
    """A request's error as one string: empty for a success."""
    if result.success:
        return ""
    kind = result.error_type or "unknown"
    return f"{kind}: {result.error}" if result.error else kind


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def format_report(report: RateReport) -> str:
    """A printed block per rate, laid out like ``vllm bench serve``'s."""
    if report.burstiness is None:
        arrival = "trace"
    elif report.burstiness == 1.0:
        arrival = "Poisson"
    else:
        arrival = f"gamma, burstiness {report.burstiness:g}"
    rate = "inf" if math.isinf(report.request_rate) else f"{report.request_rate:g}"
    title = f" rate {rate} req/s ({arrival}) "
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(report.error_counts.items()))
    rows: list[tuple[str, str]] = [
        ("Successful requests:", str(report.completed)),
        ("Failed requests:", str(report.failed) + (f"  ({errors})" if errors else "")),
        (
            "Maximum request concurrency:",
            "-" if report.max_concurrency is None else str(report.max_concurrency),
        ),
        ("Benchmark duration (s):", _fmt(report.duration)),
        ("Total input tokens:", str(report.total_input_tokens)),
        ("Total generated tokens:", str(report.total_output_tokens)),
        ("Request throughput (req/s):", _fmt(report.request_throughput)),
        ("Request goodput (req/s):", _fmt(report.request_goodput)),
        ("Output token throughput (tok/s):", _fmt(report.output_throughput)),
        ("Total token throughput (tok/s):", _fmt(report.total_token_throughput)),
        ("Peak output token throughput (tok/s):", _fmt(report.max_output_tokens_per_s)),
        ("Peak concurrent requests:", str(report.max_concurrent_requests)),
    ]
    lines = [title.center(58, "=")]
    lines += [f"{k:<40}{v:>18}" for k, v in rows]
    for name, key in (
        ("Time to First Token", "ttft"),
        ("Time per Output Token (excl. 1st token)", "tpot"),
        ("Inter-token Latency", "itl"),
        ("End-to-end Latency", "e2el"),
    ):
        lines.append(f" {name} ".center(58, "-"))
        short = "E2EL" if key == "e2el" else key.upper()
        for stat, label in (("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p99", "P99")):
            value = getattr(report, f"{stat}_{key}_ms")
            lines.append(f"{f'{label} {short} (ms):':<40}{_fmt(value):>18}")
    lines.append(" SLO attainment ".center(58, "-"))
    slo = f"TTFT <= {report.ttft_slo_ms:g} ms, TPOT <= {report.tpot_slo_ms:g} ms"
    lines.append(f"{'SLOs:':<18}{slo:>40}")
    for label, value in (
        ("TTFT attainment:", report.ttft_attainment),
        ("TBT attainment:", report.tbt_attainment),
        ("Joint attainment:", report.slo_attainment),
        ("Gaps within TPOT SLO:", report.itl_within_tbt),
    ):
        lines.append(f"{label:<40}{_fmt(value, '.1%'):>18}")
    lines.append(" Generator ".center(58, "-"))
    lines.append(f"{'Achieved send rate (req/s):':<40}{_fmt(report.achieved_request_rate):>18}")
    lags = f"{_fmt(report.send_lag_p50_ms, '.3f')} / {_fmt(report.send_lag_p99_ms, '.3f')}"
    lines.append(f"{'Send lag P50 / P99 (ms):':<40}{lags:>18}")
    lines.append("=" * 58)
    return "\n".join(lines)


CSV_FIELDS = (
    "request_rate",
    "index",
    "scheduled_s",
    "start_s",
    "sent_s",
    "send_lag_ms",
    "ttft_ms",
    "tpot_ms",
    "e2el_ms",
    "input_tokens",
    "output_tokens",
    "expected_output_tokens",
    "success",
    "status",
    "error_type",
    "error",
)


def csv_rows(request_rate: float, results: Iterable[RequestResult]) -> Iterable[dict[str, Any]]:
    """One CSV row per request (``CSV_FIELDS``); times in seconds from the run's start,
    latencies in milliseconds, empty where not available."""
    for r in results:
        record = r.record()
        yield {
            "request_rate": request_rate,
            "index": r.index,
            "scheduled_s": r.t_scheduled,
            "start_s": r.t_start,
            "sent_s": r.t_sent,
            "send_lag_ms": _ms(r.send_lag),
            "ttft_ms": _ms(ttft(record)),
            "tpot_ms": _ms(tpot(record)),
            "e2el_ms": _ms(e2e(record)),
            "input_tokens": r.input_tokens,
            "output_tokens": r.output_tokens,
            "expected_output_tokens": r.expected_output_tokens,
            "success": r.success,
            "status": r.status,
            "error_type": r.error_type,
            "error": r.error,
        }


def write_csv(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    with Path(path).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
