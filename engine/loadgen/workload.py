"""What the load generator sends: synthetic requests, ShareGPT conversations, JSONL traces.

Every workload yields ``RequestSpec`` values: a prompt, its length in tokens and the
number of output tokens to ask for (sent as ``max_tokens`` with ``ignore_eos`` so the
server honours it). Lengths are measured with the target model's tokenizer when one is
given (``token_counter``), else estimated at four characters per token for text (the
simulator's ``estimate_tokens``).
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shunter.engine.sim.workload import (
    MAX_PROMPT_TOKENS,
    MAX_TOTAL_TOKENS,
    MIN_TOKENS,
    TraceRow,
    estimate_tokens,
    sharegpt_exchanges,
    sharegpt_like,
    trace_rows,
)

TokenCounter = Callable[[str], int]
"""Counts the tokens of a text."""


class WorkloadError(ValueError):
    """A workload file or length spec that cannot be used; the message says where and why."""


@dataclass(frozen=True)
class RequestSpec:
    """One request to send.

    ``input_len`` is the prompt's length in tokens (measured or estimated, see the module
    docstring); ``output_len`` the output tokens asked for. ``t`` is the arrival time in
    seconds from the start of a trace, None for workloads that leave arrivals to an
    arrival process.
    """

    prompt: str
    input_len: int
    output_len: int
    t: float | None = None


def token_counter(model_dir: str | Path) -> TokenCounter:
    """The token count of a text under the model's ``tokenizer.json`` (no special tokens)."""
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise WorkloadError(f"{model_dir}: no tokenizer.json in this model directory")
    tokenizer = Tokenizer.from_file(str(path))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


# Short, common English words: byte-pair tokenizers give about one token per word with
# its leading space, so a synthetic prompt of N words is about N tokens long.
_WORD_TEXT = (
    "the of and to in is it you that he was for on are as with his they at be this "
    "have from or one had by word but not what all were we when your can said there use "
    "an each which she do how their if will up other about out many then them these so "
    "some her would make like him into time has look two more write go see number no way "
    "could people my than first water been call who oil its now find long down day did get "
    "come made may part"
)
_WORDS = tuple(_WORD_TEXT.split())


def synthetic_prompt(num_words: int, rng: random.Random) -> str:
    """``num_words`` random common words: a prompt of about ``num_words`` tokens that no
    two requests share, so prefix caching cannot shorten it."""
    return " ".join(rng.choice(_WORDS) for _ in range(num_words))


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


# --- ShareGPT ---------------------------------------------------------------------------


def load_sharegpt(path: str | Path, count: TokenCounter | None = None) -> SampledWorkload:
    """Requests from a ShareGPT-format JSON file (``sharegpt_exchanges``): each
    conversation's first exchange gives one request, its reply setting the output length,
    as ``vllm bench serve`` does. Exchanges outside vLLM's length filter (prompt and reply
    >= 4 tokens, prompt <= 1024, both <= 2048) are skipped; a malformed entry is an error
    naming it. ``count`` counts tokens (the target's tokenizer); without it lengths are
    estimated at four characters per token.
    """
    count = count or estimate_tokens
    try:
        exchanges = sharegpt_exchanges(path)
    except ValueError as exc:
        raise WorkloadError(str(exc)) from None
    specs = []
    for prompt, reply in exchanges:
        input_len, output_len = count(prompt), count(reply)
        if sharegpt_like.keeps(input_len, output_len):
            specs.append(RequestSpec(prompt, input_len, output_len))
    if not specs:
        raise WorkloadError(
            f"{path}: no conversation has a human turn followed by a reply within "
            f"{MIN_TOKENS}..{MAX_PROMPT_TOKENS} prompt and {MAX_TOTAL_TOKENS} total tokens"
        )
    return SampledWorkload(tuple(specs), f"sharegpt:{Path(path).name}")


# --- JSONL traces -----------------------------------------------------------------------


def load_trace(
    path: str | Path, count: TokenCounter | None = None, *, seed: int = 0
) -> TraceWorkload:
    """Requests with arrival times from a JSONL file, one object per line.

    Each line holds ``t`` (arrival, seconds), ``output_tokens`` and either ``prompt``
    (text) or ``prompt_tokens`` (a synthetic prompt of that many words is made, seeded by
    ``seed``); both may be given. This is the simulator's trace format
    (``shunter.engine.sim.workload.write_trace``), so a simulated workload replays against a
    real server; its ``model`` key is ignored (the target names the model). Blank lines
    are skipped; times are sorted and shifted so the first arrival is at 0.
    """
    rng = random.Random(seed)
    count = count or estimate_tokens
    try:
        rows = [_request(row, count, rng) for row in trace_rows(path)]
    except ValueError as exc:
        raise WorkloadError(str(exc)) from None
    if not rows:
        raise WorkloadError(f"{path}: the trace has no requests")
    rows.sort(key=lambda r: r.t or 0.0)
    t0 = rows[0].t or 0.0
    specs = tuple(RequestSpec(r.prompt, r.input_len, r.output_len, (r.t or 0.0) - t0) for r in rows)
    return TraceWorkload(specs, f"trace:{Path(path).name}")


def _request(row: TraceRow, count: TokenCounter, rng: random.Random) -> RequestSpec:
    """A trace row as a request: its prompt text, else a synthetic prompt of its token
    count; its length the given count, else the text's."""
    prompt = row.prompt
    if prompt is None:
        if row.prompt_tokens is None:
            raise ValueError(f"{row.where}: needs 'prompt' or 'prompt_tokens'")
        prompt = synthetic_prompt(row.prompt_tokens, rng)
    input_len = row.prompt_tokens if row.prompt_tokens is not None else count(prompt)
    return RequestSpec(prompt, input_len, row.output_tokens, row.t)
