"""Arrival schedules: over many samples the realized rate and the inter-arrival CV match
Poisson (CV 1) and gamma with shape ``burstiness`` (CV 1 / sqrt(burstiness))."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from shunter.engine.loadgen.arrivals import ArrivalProcess

N = 40_000


def gaps(times: list[float]) -> list[float]:
    return [times[0], *(b - a for a, b in itertools.pairwise(times))]


@pytest.mark.parametrize(
    ("burstiness", "rate"),
    [(1.0, 8.0), (0.25, 50.0), (4.0, 200.0)],
    ids=["poisson", "bursty", "smooth"],
)
def test_realized_rate_and_cv_match_the_process(burstiness: float, rate: float) -> None:
    process = ArrivalProcess(burstiness)
    times = process.times(rate, random.Random(7), num_requests=N)
    g = gaps(times)
    realized = N / times[-1]
    cv = statistics.pstdev(g) / statistics.fmean(g)
    expected_cv = 1.0 / math.sqrt(burstiness)
    # Standard errors at N = 40,000: the rate's is CV / sqrt(N) (<= 1%); the CV's is a
    # few percent for the heavy-tailed bursty case.
    assert realized == pytest.approx(rate, rel=0.03)
    assert cv == pytest.approx(expected_cv, rel=0.05)
    assert all(x >= 0 for x in g)


def test_poisson_counts_per_window_have_variance_equal_to_mean() -> None:
    """A Poisson process: arrivals per one-second window are Poisson(rate), dispersion 1."""
    times = ArrivalProcess().times(20.0, random.Random(3), duration_s=2000.0)
    counts = [0] * 2000
    for t in times:
        counts[int(t)] += 1
    assert statistics.pvariance(counts) / statistics.fmean(counts) == pytest.approx(1.0, abs=0.1)


def test_duration_mode_stops_at_the_end() -> None:
    times = ArrivalProcess(0.5).times(100.0, random.Random(1), duration_s=30.0)
    assert times == sorted(times) and times[-1] < 30.0
    assert len(times) == pytest.approx(3000, rel=0.1)


def test_same_seed_same_schedule() -> None:
    a = ArrivalProcess(2.0).times(5.0, random.Random(11), num_requests=100)
    b = ArrivalProcess(2.0).times(5.0, random.Random(11), num_requests=100)
    c = ArrivalProcess(2.0).times(5.0, random.Random(12), num_requests=100)
    assert a == b and a != c


def test_infinite_rate_sends_everything_at_once() -> None:
    assert ArrivalProcess().times(math.inf, random.Random(0), num_requests=5) == [0.0] * 5
    with pytest.raises(ValueError, match="infinite rate"):
        ArrivalProcess().times(math.inf, random.Random(0), duration_s=5.0)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"num_requests": 3, "duration_s": 1.0}, {"num_requests": 0}, {"duration_s": -1.0}],
)
def test_bad_arguments_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ArrivalProcess().times(1.0, random.Random(0), **kwargs)  # type: ignore[arg-type]


def test_burstiness_must_be_positive() -> None:
    with pytest.raises(ValueError, match="burstiness"):
        ArrivalProcess(0.0)
