"""What the load generator sends: sources of requests, synthetic ones of random common
words or those read from a ShareGPT file (``sharegpt.sharegpt_workload``) or a JSONL
trace (``traces.trace_workload``).

Every workload yields ``RequestSpec`` values: a prompt, its length in tokens and the
number of output tokens to ask for (sent as ``max_tokens`` with ``ignore_eos`` so the
server honours it). Lengths are measured with the target model's tokenizer when one is
given (``tokens.token_counter``), else estimated at four characters per token for text
(``tokens.estimate_tokens``).
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass

from shunter.engine.workload.requests import RequestSpec, WorkloadError
from shunter.engine.workload.tokens import TokenCounter, synthetic_prompt

# --- synthetic lengths ------------------------------------------------------------------


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts: ``constant`` (``low``), ``uniform`` over
    ``low..high`` inclusive, or ``exponential`` with mean ``low`` (at least one token)."""

    kind: str
    low: int
    high: int

    def __post_init__(self) -> None:
        if self.kind not in ("constant", "uniform", "exponential"):
            raise WorkloadError(f"unknown length distribution {self.kind!r}")
        if self.low < 1 or self.high < self.low:
            raise WorkloadError(f"bad length range {self.low}..{self.high}")

    @classmethod
    def parse(cls, text: str) -> LengthDist:
        """``128`` (constant), ``64..256`` (uniform, inclusive) or ``exp:200`` (mean 200)."""
        value = text.strip()
        try:
            if value.startswith("exp:"):
                mean = int(value[4:])
                return cls("exponential", mean, mean)
            if ".." in value:
                low, high = value.split("..", 1)
                return cls("uniform", int(low), int(high))
            return cls("constant", int(value), int(value))
        except ValueError as exc:
            if isinstance(exc, WorkloadError):
                raise
            raise WorkloadError(
                f"expected a length such as 128, 64..256 or exp:200, not {text!r}"
            ) from None

    def draw(self, rng: random.Random) -> int:
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        if self.kind == "exponential":
            return max(1, round(rng.expovariate(1.0 / self.low)))
        return self.low


# --- workloads --------------------------------------------------------------------------


class Workload(ABC):
    """A source of requests."""

    @property
    @abstractmethod
    def name(self) -> str:
        """How reports name the workload (``synthetic``, ``sharegpt:FILE``, ``trace:FILE``)."""

    @abstractmethod
    def draw(self, num_requests: int, rng: random.Random) -> list[RequestSpec]:
        """``num_requests`` requests; every random choice comes from ``rng``."""


@dataclass(frozen=True)
class SyntheticWorkload(Workload):
    """Prompts of random common words with lengths drawn from ``input_len``, asking for
    ``output_len`` tokens. With ``count`` the prompt's real token count is recorded."""

    input_len: LengthDist
    output_len: LengthDist
    count: TokenCounter | None = None

    @property
    def name(self) -> str:
        return "synthetic"

    def draw(self, num_requests: int, rng: random.Random) -> list[RequestSpec]:
        specs = []
        for _ in range(num_requests):
            words = self.input_len.draw(rng)
            prompt = synthetic_prompt(words, rng)
            input_len = self.count(prompt) if self.count else words
            specs.append(RequestSpec(prompt, input_len, self.output_len.draw(rng)))
        return specs


@dataclass(frozen=True)
class PrefixRepetitionWorkload(Workload):
    """vLLM's ``prefix_repetition`` dataset (``PrefixRepetitionRandomDataset``):
    ``num_prefixes`` random prefixes of ``prefix_len`` words, each followed in an equal
    share of the requests by a suffix of ``suffix_len`` words of its own, shuffled; every
    request asks for ``output_len`` tokens. A prefix cache serves each prefix from its
    second request on. vLLM's defaults: 256, 256, 10, 128."""

    prefix_len: int = 256
    suffix_len: int = 256
    num_prefixes: int = 10
    output_len: int = 128
    count: TokenCounter | None = None

    @property
    def name(self) -> str:
        return "prefix_repetition"

    def draw(self, num_requests: int, rng: random.Random) -> list[RequestSpec]:
        prefixes = [synthetic_prompt(self.prefix_len, rng) for _ in range(self.num_prefixes)]
        specs = []
        for i in range(num_requests):
            prompt = f"{prefixes[i % self.num_prefixes]} {synthetic_prompt(self.suffix_len, rng)}"
            words = self.prefix_len + self.suffix_len
            input_len = self.count(prompt) if self.count else words
            specs.append(RequestSpec(prompt, input_len, self.output_len))
        rng.shuffle(specs)
        return specs


@dataclass(frozen=True)
class SampledWorkload(Workload):
    """Requests drawn from a fixed list (a loaded ShareGPT file): shuffled with the
    caller's generator, then cycled when more are asked for than the list holds."""

    specs: tuple[RequestSpec, ...]
    source: str

    @property
    def name(self) -> str:
        return self.source

    def draw(self, num_requests: int, rng: random.Random) -> list[RequestSpec]:
        order = list(self.specs)
        rng.shuffle(order)
        return [order[i % len(order)] for i in range(num_requests)]


@dataclass(frozen=True)
class TraceWorkload(Workload):
    """Requests with their own arrival times (``RequestSpec.t``), in time order, the
    first at 0. ``draw`` returns the first ``n``, cycling the trace (shifted by its
    span) when more are asked for."""

    specs: tuple[RequestSpec, ...]
    source: str

    @property
    def name(self) -> str:
        return self.source

    @property
    def span_s(self) -> float:
        """Seconds from the first arrival to the last."""
        return self.specs[-1].t or 0.0

    def mean_rate(self) -> float:
        """Arrivals per second over the trace (inf when every arrival is at 0)."""
        span = self.span_s
        return (len(self.specs) - 1) / span if span > 0 else math.inf

    def draw(self, num_requests: int, rng: random.Random) -> list[RequestSpec]:
        n = len(self.specs)
        # A cycled copy starts one mean gap after the last arrival.
        period = self.span_s + (self.span_s / (n - 1) if n > 1 else 0.0)
        out = []
        for i in range(num_requests):
            spec = self.specs[i % n]
            t = (spec.t or 0.0) + (i // n) * period
            out.append(RequestSpec(spec.prompt, spec.input_len, spec.output_len, t))
        return out
