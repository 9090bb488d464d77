"""Serving metrics over per-request records, as ARCHITECTURE.md "Metric definitions" fixes.

Pure functions: the simulator, the load generator and benchmark jobs all feed them
records, whatever produced the times.

- TTFT: arrival to first output token. ITL: each gap between consecutive output tokens.
  TPOT: (e2e - TTFT) / (output tokens - 1), e2e being arrival to last token.
- A request meets its TTFT SLO if TTFT <= S_F, its TBT SLO if TPOT <= S_B; a request with
  a single output token has no TPOT and meets the TBT SLO if it succeeded. Failed or
  aborted requests miss both.
- Attainment: the share of all requests meeting each SLO, and both. Goodput: requests
  meeting both per second of the run (vLLM's definition).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from shunter.engine import latency


@dataclass(frozen=True)
class RequestRecord:
    """What a client saw of one request.

    ``token_times`` are the arrival times of the output tokens, one per token (a client
    receiving several tokens in one chunk repeats the chunk's time), or one per streamed
    chunk when the client cannot tell the tokens of a chunk apart (ITL is then the gap
    between chunks, as ``vllm bench serve`` measures it; ``num_output_tokens`` still
    counts tokens). It may be empty when only the first and last token times are known,
    and then ITL is not available.
    ``t_first_token`` and ``t_last_token`` are None when no token came back.
    """

    t_arrival: float
    t_first_token: float | None
    t_last_token: float | None
    num_output_tokens: int
    success: bool
    token_times: tuple[float, ...] = ()

    @classmethod
    def from_token_times(
        cls, t_arrival: float, token_times: Sequence[float], *, success: bool = True
    ) -> RequestRecord:
        """A record from per-token times (the simulator's and a streaming client's view)."""
        times = tuple(token_times)
        return cls(
            t_arrival=t_arrival,
            t_first_token=times[0] if times else None,
            t_last_token=times[-1] if times else None,
            num_output_tokens=len(times),
            success=success,
            token_times=times,
        )


def ttft(record: RequestRecord) -> float | None:
    """Seconds from arrival to the first token; None if no token came."""
    return latency.ttft(record.t_arrival, record.t_first_token)


def tpot(record: RequestRecord) -> float | None:
    """Mean seconds per output token after the first; None below two tokens."""
    return latency.tpot(record.t_first_token, record.t_last_token, record.num_output_tokens)


def e2e(record: RequestRecord) -> float | None:
    """Seconds from arrival to the last token; None if no token came."""
    if record.t_last_token is None:
        return None
    return record.t_last_token - record.t_arrival


def itls(record: RequestRecord) -> list[float]:
    """Every gap between consecutive output tokens."""
    times = record.token_times
    return [b - a for a, b in itertools.pairwise(times)]


def meets_ttft(record: RequestRecord, ttft_slo_s: float) -> bool:
    return latency.ttft_met(success=record.success, ttft_s=ttft(record), target_s=ttft_slo_s)


def meets_tbt(record: RequestRecord, tbt_slo_s: float) -> bool:
    """A simulated request that ran has all its token times, so its outcome is known."""
    tokens = record.num_output_tokens if record.t_first_token is not None else 0
    met = latency.tbt_met(
        success=record.success and tokens > 0,
        tokens=tokens,
        tpot_s=tpot(record),
        target_s=tbt_slo_s,
    )
    return bool(met)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), linear between closest ranks (numpy's default);
    None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def std(values: Sequence[float]) -> float | None:
    """The population standard deviation (numpy's ``std``); None for no values."""
    if not values:
        return None
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


@dataclass(frozen=True)
class Percentiles:
    """P50, P90, P99, the mean and the standard deviation of some values; all None for no
    values."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    std: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        mean = math.fsum(values) / len(values) if values else None
        return cls(
            percentile(values, 50),
            percentile(values, 90),
            percentile(values, 99),
            mean,
            std(values),
        )


@dataclass(frozen=True)
class Summary:
    """Aggregate metrics of one run. Attainments are shares in [0, 1]; percentiles are
    over the succeeded requests that have the value (None when none has). Throughputs
    count succeeded requests and their output tokens per second of the run."""

    num_requests: int
    num_succeeded: int
    ttft_attainment: float
    tbt_attainment: float
    slo_attainment: float
    goodput: float
    request_throughput: float
    num_output_tokens: int
    throughput_tok_s: float
    ttft_s: Percentiles
    tpot_s: Percentiles
    itl_s: Percentiles
    e2e_s: Percentiles
    itl_within_tbt: float | None


def summarize(
    records: Sequence[RequestRecord], *, ttft_slo_s: float, tbt_slo_s: float, duration_s: float
) -> Summary:
    """Metrics of ``records`` against one SLO class over a run of ``duration_s`` seconds.

    ``itl_within_tbt`` is the token-level share of gaps <= ``tbt_slo_s`` over all
    recorded gaps.
    """
    if duration_s <= 0:
        raise ValueError("duration_s must be positive")
    n = len(records)
    ttft_ok = [meets_ttft(r, ttft_slo_s) for r in records]
    tbt_ok = [meets_tbt(r, tbt_slo_s) for r in records]
    good = sum(a and b for a, b in zip(ttft_ok, tbt_ok, strict=True))
    ttfts = [v for r in records if r.success and (v := ttft(r)) is not None]
    tpots = [v for r in records if r.success and (v := tpot(r)) is not None]
    e2es = [v for r in records if r.success and (v := e2e(r)) is not None]
    gaps = [g for r in records if r.success for g in itls(r)]
    tokens = sum(r.num_output_tokens for r in records if r.success)
    share = (lambda k: k / n) if n else (lambda _k: 0.0)
    return Summary(
        num_requests=n,
        num_succeeded=sum(r.success for r in records),
        ttft_attainment=share(sum(ttft_ok)),
        tbt_attainment=share(sum(tbt_ok)),
        slo_attainment=share(good),
        goodput=good / duration_s,
        request_throughput=sum(r.success for r in records) / duration_s,
        num_output_tokens=tokens,
        throughput_tok_s=tokens / duration_s,
        ttft_s=Percentiles.of(ttfts),
        tpot_s=Percentiles.of(tpots),
        itl_s=Percentiles.of(gaps),
        e2e_s=Percentiles.of(e2es),
        itl_within_tbt=sum(g <= tbt_slo_s for g in gaps) / len(gaps) if gaps else None,
    )
