"""Arrival processes: gamma gaps keep the rate and set the burstiness; the named ones
and the cv alias."""

from __future__ import annotations

import random
import statistics

import pytest

from shunter.engine.workload.arrivals import (
    ARRIVALS,
    AZURE_CODE_CV,
    AZURE_CONV_CV,
    gamma_arrivals,
    get_arrivals,
    poisson_arrivals,
    resolve_arrivals,
)


@pytest.mark.parametrize("rate", [0.5, 4.0, 20.0])
def test_poisson_arrivals_have_the_requested_rate(rate: float) -> None:
    times = poisson_arrivals(rate, 20_000, random.Random(0))
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert times == sorted(times)
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.03)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_arrivals_keep_the_rate_and_set_burstiness(cv: float) -> None:
    times = gamma_arrivals(10.0, cv, 40_000, random.Random(3))
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.05)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1)


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *times], times, strict=False)]


@pytest.mark.parametrize(("name", "cv"), [("azure-code", AZURE_CODE_CV), ("azure-conv", 1.094)])
def test_azure_arrivals_have_the_traces_coefficient_of_variation(name: str, cv: float) -> None:
    process = get_arrivals(name)
    assert process.cv == cv and process.sources
    gaps = _gaps(gamma_arrivals(10.0, process.cv, 200_000, random.Random(0)))
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.05)
    # The coding trace's CV of 13 makes a sample's CV converge slowly (kurtosis ~1000).
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1)


def test_arrival_names_and_the_cv_alias() -> None:
    assert get_arrivals("poisson").cv == 1.0 and AZURE_CONV_CV < AZURE_CODE_CV
    assert set(ARRIVALS) == {"poisson", "azure-code", "azure-conv"}
    assert get_arrivals("gamma:2.5").cv == 2.5
    assert resolve_arrivals("poisson", 2.5).cv == 2.5  # --cv 2.5 is gamma:2.5
    assert resolve_arrivals("azure-code", 1.0).cv == AZURE_CODE_CV
    for bad in ("gamma:x", "gamma:0", "gamma:-1", "gamma:inf", "bursty"):
        with pytest.raises(ValueError, match="gamma:CV"):
            get_arrivals(bad)
    with pytest.raises(ValueError, match="give one"):
        resolve_arrivals("azure-code", 2.0)
