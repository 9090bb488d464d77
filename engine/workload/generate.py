"""Generated workloads: requests built from arrival times and a length sampler, the
lengths a run draws, how a run names and records what it generated, and the samples of
each named workload shipped as traces.

Every random draw goes through a ``random.Random`` the caller seeds, so a workload is a
pure function of its arguments.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from shunter.engine.workload.arrivals import (
    DEFAULT_ARRIVALS,
    Arrivals,
    gamma_arrivals,
    get_arrivals,
)
from shunter.engine.workload.lengths import (
    DEFAULT_WORKLOAD,
    LengthSampler,
    get_workload,
    resample,
    sharegpt_like,
)
from shunter.engine.workload.requests import WorkloadRequest
from shunter.engine.workload.sharegpt import sharegpt_lengths


def build_workload(
    arrivals: Iterable[float], lengths: LengthSampler, model: str, rng: random.Random
) -> list[WorkloadRequest]:
    """One request per arrival time, lengths drawn from ``lengths`` with ``rng``."""
    requests = []
    for t in arrivals:
        prompt, output = lengths(rng)
        requests.append(WorkloadRequest(t, prompt, output, model))
    return requests


def synthetic_workload(
    *,
    rate: float,
    duration_s: float,
    model: str,
    seed: int,
    cv: float = 1.0,
    lengths: LengthSampler = sharegpt_like,
) -> list[WorkloadRequest]:
    """``round(rate * duration_s)`` requests with gamma (Poisson when ``cv == 1``) gaps,
    the way SuperInfer samples ``120 x RPS`` requests for a 120 s run (Appendix E.2.3)."""
    rng = random.Random(seed)
    arrivals = gamma_arrivals(rate, cv, round(rate * duration_s), rng)
    return build_workload(arrivals, lengths, model, rng)


def lengths_from(sharegpt: str | Path | None, workload: str = DEFAULT_WORKLOAD) -> LengthSampler:
    """The named workload's lengths, or (given a file) pairs resampled from a
    ShareGPT-format file."""
    named = get_workload(workload, sharegpt)
    if sharegpt is None:
        return named.lengths
    return resample(sharegpt_lengths(sharegpt))


def generated_label(duration_s: float, workload: str, arrivals: Arrivals) -> str:
    """How a run's heading names its generated requests: ``120 s of arrivals`` with the
    defaults, else naming the arrival process and the workload."""
    if workload == DEFAULT_WORKLOAD and arrivals.name == DEFAULT_ARRIVALS:
        return f"{duration_s:g} s of arrivals"
    return f"{duration_s:g} s of {arrivals.name} arrivals, {workload} lengths"


def generated_config(
    workload: str, arrivals: Arrivals, *, sharegpt: str | None, trace: str | None
) -> dict[str, Any]:
    """What a run's JSON config says of its requests: ``workload`` (how they were made)
    and, unless a trace gave them, ``workload_sources`` and ``arrival_process``."""
    if trace is not None:
        return {"workload": "JSONL trace"}
    named = get_workload(workload, sharegpt)
    return {
        "workload": "ShareGPT file" if sharegpt is not None else named.description,
        "workload_sources": [] if sharegpt is not None else list(named.sources),
        "arrival_process": {
            "name": arrivals.name,
            "cv": arrivals.cv,
            "description": arrivals.description,
            "sources": list(arrivals.sources),
        },
    }


# Samples of each named workload shipped as JSONL traces (data/<name>.jsonl), replayable
# with --trace and compared with what the generator makes now: 200 requests for
# llama-3-8b at 4 req/s, seed 0; the Azure ones with their own trace's arrivals.
SAMPLE_TRACES: dict[str, tuple[str, str]] = {
    "sharegpt": ("sharegpt", "poisson"),
    "sharegpt-gen": ("sharegpt-gen", "poisson"),
    "lmsys": ("lmsys", "poisson"),
    "azure-code": ("azure-code", "azure-code"),
    "azure-conv": ("azure-conv", "azure-conv"),
}


def sample_trace(name: str) -> list[WorkloadRequest]:
    """The requests of the shipped sample ``name`` (``SAMPLE_TRACES``), as generated now;
    ``write_trace(DATA_DIR / f"{name}.jsonl", sample_trace(name))`` rewrites its file."""
    workload, arrivals = SAMPLE_TRACES[name]
    return synthetic_workload(
        rate=4.0,
        duration_s=50.0,
        model="llama-3-8b",
        seed=0,
        cv=get_arrivals(arrivals).cv,
        lengths=get_workload(workload).lengths,
    )
