"""Arrival processes: request arrival times with gamma-distributed gaps, and the named
ones (``ARRIVALS``) whose burstiness comes from published traces.

Every random draw goes through a ``random.Random`` the caller seeds, so arrivals are a
pure function of their arguments.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


def poisson_arrivals(rate: float, num_requests: int, rng: random.Random) -> list[float]:
    """``num_requests`` arrival times with exponential gaps of mean ``1 / rate``."""
    return gamma_arrivals(rate, 1.0, num_requests, rng)


def gamma_arrivals(rate: float, cv: float, num_requests: int, rng: random.Random) -> list[float]:
    """Arrival times with gamma-distributed gaps: mean ``1 / rate``, coefficient of
    variation ``cv`` (1 is Poisson; above 1 is burstier, below 1 smoother)."""
    if rate <= 0 or cv <= 0:
        raise ValueError("rate and cv must be positive")
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    times: list[float] = []
    t = 0.0
    for _ in range(num_requests):
        t += rng.gammavariate(shape, scale)
        times.append(t)
    return times


@dataclass(frozen=True)
class Arrivals:
    """A named arrival process: gamma gaps with coefficient of variation ``cv`` (1 is
    Poisson) at whatever rate a run asks for, and where ``cv`` comes from."""

    name: str
    cv: float
    description: str
    sources: tuple[str, ...] = ()


# The coefficient of variation of the gaps between consecutive TIMESTAMPs of Azure's LLM
# inference traces of 2023 (Splitwise, ISCA 2024; Oneiros §7.1 replays the coding one,
# scaled to each rate, which keeps its CV), measured over each whole file: code, 8,819
# requests in 3,436 s, CV 13.15 (whole minutes without a request; median gap 0.064 s,
# longest 217 s); conversation, 19,366 requests in 3,502 s, CV 1.094.
# Azure/AzurePublicDataset@7909210 data/AzureLLMInferenceTrace_{code,conv}.csv. A gamma
# renewal process keeps the rate and the CV, not the trace's minute-long lulls.
AZURE_CODE_CV = 13.15
AZURE_CONV_CV = 1.094
AZURE_TRACES = "Azure/AzurePublicDataset@7909210 data/AzureLLMInferenceTrace_{}.csv"

ARRIVALS: dict[str, Arrivals] = {
    a.name: a
    for a in (
        Arrivals("poisson", 1.0, "Poisson: exponential gaps"),
        Arrivals(
            "azure-code",
            AZURE_CODE_CV,
            f"gamma gaps with the CV of Azure's coding trace, {AZURE_CODE_CV:g}",
            (AZURE_TRACES.format("code"),),
        ),
        Arrivals(
            "azure-conv",
            AZURE_CONV_CV,
            f"gamma gaps with the CV of Azure's conversation trace, {AZURE_CONV_CV:g}",
            (AZURE_TRACES.format("conv"),),
        ),
    )
}
DEFAULT_ARRIVALS = "poisson"


def get_arrivals(name: str) -> Arrivals:
    """An ``ARRIVALS`` process by name, or ``gamma:CV``: gamma gaps with that CV."""
    if name.startswith("gamma:"):
        try:
            cv = float(name.removeprefix("gamma:"))
        except ValueError:
            cv = math.nan
        if not 0 < cv < math.inf:
            raise ValueError(f"arrivals {name!r}: gamma:CV needs a positive CV")
        return Arrivals(name, cv, f"gamma gaps, CV {cv:g}")
    try:
        return ARRIVALS[name]
    except KeyError:
        choices = ", ".join([*ARRIVALS, "gamma:CV"])
        raise ValueError(f"unknown arrivals {name!r}: choose from {choices}") from None


def resolve_arrivals(arrivals: str, cv: float) -> Arrivals:
    """The process a run asks for: ``arrivals`` by name, or with a ``cv`` other than 1
    (``--cv``, the older knob) gamma gaps of that CV. Both at once is refused."""
    if cv == 1.0:
        return get_arrivals(arrivals)
    if arrivals != DEFAULT_ARRIVALS:
        raise ValueError(
            f"cv {cv:g} and arrivals {arrivals} both set the arrival process "
            "(--cv CV is --arrivals gamma:CV): give one"
        )
    return get_arrivals(f"gamma:{cv!r}")
