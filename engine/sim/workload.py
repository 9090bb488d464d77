"""Workloads: request arrivals, request lengths, ShareGPT files and JSONL traces.

Every random draw goes through a ``random.Random`` the caller seeds, so a workload is a
pure function of its arguments.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload: arrival time in seconds from the start, prompt and
    output lengths in tokens, and the model it is for."""

    t: float
    prompt_tokens: int
    output_tokens: int
    model: str

    def __post_init__(self) -> None:
        if self.t < 0 or self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(f"invalid workload request {self}")


# --- arrivals ---------------------------------------------------------------------------


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


# --- lengths ----------------------------------------------------------------------------

LengthSampler = Callable[[random.Random], tuple[int, int]]
"""Draws one ``(prompt_tokens, output_tokens)`` pair."""

# vLLM's ShareGPT benchmark keeps requests with prompt and output >= 4 tokens, prompt
# <= 1024 and prompt + output <= 2048 (benchmarks/benchmark_serving.py,
# sample_sharegpt_requests); the synthetic sampler and the loader apply the same filter.
MIN_TOKENS = 4
MAX_PROMPT_TOKENS = 1024
MAX_TOTAL_TOKENS = 2048

# ShareGPT first turns average 161.31 prompt and 337.99 output tokens (Kwon et al.,
# "Efficient Memory Management for LLM Serving with PagedAttention", SOSP 2023, Fig. 11).
# Both are drawn log-normal, a heavy right tail like the dataset's histograms, with
# sigma = 1.0: an assumption (no published spread); replay the real file with
# load_sharegpt() when the shape matters.
SHAREGPT_PROMPT_MEAN = 161.31
SHAREGPT_OUTPUT_MEAN = 337.99
SHAREGPT_SIGMA = 1.0


def _keep(prompt: int, output: int) -> bool:
    return (
        prompt >= MIN_TOKENS
        and output >= MIN_TOKENS
        and prompt <= MAX_PROMPT_TOKENS
        and prompt + output <= MAX_TOTAL_TOKENS
    )


def sharegpt_like(rng: random.Random) -> tuple[int, int]:
    """A synthetic ShareGPT-like ``(prompt, output)`` pair (see the constants above);
    pairs outside vLLM's benchmark filter are redrawn."""
    mu_p = math.log(SHAREGPT_PROMPT_MEAN) - SHAREGPT_SIGMA**2 / 2
    mu_o = math.log(SHAREGPT_OUTPUT_MEAN) - SHAREGPT_SIGMA**2 / 2
    while True:
        prompt = round(rng.lognormvariate(mu_p, SHAREGPT_SIGMA))
        output = round(rng.lognormvariate(mu_o, SHAREGPT_SIGMA))
        if _keep(prompt, output):
            return prompt, output


def fixed_lengths(prompt_tokens: int, output_tokens: int) -> LengthSampler:
    """A sampler that always returns the same pair."""
    return lambda _rng: (prompt_tokens, output_tokens)


def resample(pairs: Sequence[tuple[int, int]]) -> LengthSampler:
    """A sampler drawing uniformly, with replacement, from ``pairs`` (e.g. a loaded file)."""
    if not pairs:
        raise ValueError("no length pairs to sample from")
    return lambda rng: pairs[rng.randrange(len(pairs))]


def lengths_from(sharegpt: str | Path | None) -> LengthSampler:
    """The synthetic ShareGPT-like distribution, or (given a file) pairs resampled from
    a ShareGPT-format file."""
    if sharegpt is None:
        return sharegpt_like
    return resample(load_sharegpt(sharegpt))


def estimate_tokens(text: str) -> int:
    """About four characters per token for English text (OpenAI's tokenizer guidance)."""
    return max(1, round(len(text) / 4))


def load_sharegpt(
    path: str | Path, count_tokens: Callable[[str], int] = estimate_tokens
) -> list[tuple[int, int]]:
    """``(prompt, output)`` token counts from a ShareGPT-format JSON file.

    The file is a list of ``{"conversations": [{"from": "human"|"gpt", "value": str},
    ...]}``. Each conversation gives one pair: its first human turn is the prompt and the
    reply that follows it the output, as SuperInfer and vLLM's benchmark do; conversations
    without such a pair, or outside vLLM's length filter, are skipped. ``count_tokens``
    counts a text's tokens (pass a tokenizer's; the default estimates).
    """
    data: list[dict[str, Any]] = json.loads(Path(path).read_text())
    pairs: list[tuple[int, int]] = []
    for item in data:
        turns = item.get("conversations") or []
        for i, turn in enumerate(turns[:-1]):
            if turn.get("from") == "human":
                reply = turns[i + 1]
                if reply.get("from") != "human":
                    prompt = count_tokens(str(turn.get("value", "")))
                    output = count_tokens(str(reply.get("value", "")))
                    if _keep(prompt, output):
                        pairs.append((prompt, output))
                break
    return pairs


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


# --- JSONL traces -----------------------------------------------------------------------


def write_trace(path: str | Path, requests: Iterable[WorkloadRequest]) -> None:
    """Write one ``{"t", "prompt_tokens", "output_tokens", "model"}`` object per line."""
    with Path(path).open("w") as f:
        for r in requests:
            row = {
                "t": r.t,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "model": r.model,
            }
            f.write(json.dumps(row) + "\n")


def read_trace(path: str | Path) -> list[WorkloadRequest]:
    """Read a JSONL trace (blank lines ignored), sorted by arrival time."""
    requests = []
    with Path(path).open() as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                requests.append(
                    WorkloadRequest(
                        float(row["t"]),
                        int(row["prompt_tokens"]),
                        int(row["output_tokens"]),
                        str(row["model"]),
                    )
                )
            except (KeyError, ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: bad trace line: {exc}") from None
    return sorted(requests, key=lambda r: r.t)


def load_trace(path: str | Path, models: Collection[str]) -> list[WorkloadRequest]:
    """``read_trace`` for a run serving ``models``: ValueError for a file that cannot be
    read, a trace without requests, or one naming a model the run does not serve."""
    try:
        requests = read_trace(path)
    except OSError as exc:
        raise ValueError(f"cannot read trace {path}: {exc.strerror}") from None
    if not requests:
        raise ValueError(f"trace {path} has no requests")
    unknown = sorted({r.model for r in requests} - set(models))
    if unknown:
        raise ValueError(
            f"trace {path} names {', '.join(unknown)}, not served in this run "
            f"(models: {', '.join(models)})"
        )
    return requests


def trace_window(requests: Sequence[WorkloadRequest]) -> tuple[float, float]:
    """A trace's arrival window (seconds up to its last arrival) and its mean rate of
    arrivals over that window (requests per second)."""
    window = max(r.t for r in requests)
    return window, len(requests) / window if window > 0 else float(len(requests))
