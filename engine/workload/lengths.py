"""Request lengths: ``(prompt, output)`` token-count samplers, and the named workloads
(``WORKLOADS``) whose lengths come from published figures and measured percentiles.

Every random draw goes through a ``random.Random`` the caller seeds, so lengths are a
pure function of their arguments.
"""

from __future__ import annotations

import bisect
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from shunter.engine.workload import DATA_DIR
from shunter.engine.workload.arrivals import AZURE_TRACES

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
# sharegpt_lengths() when the shape matters.
SHAREGPT_PROMPT_MEAN = 161.31
SHAREGPT_OUTPUT_MEAN = 337.99
SHAREGPT_SIGMA = 1.0

# vllm-ltr's Llama-3 traces, which SuperInfer replays, keep prompts of at most 1,024
# tokens, generate up to 8,192 (hao-ai-lab/vllm-ltr@13bbf6f
# benchmarks/benchmark_generate_dataset.py line 117, benchmarks/README.md's
# --output-len 8192) and, replayed, drop prompts or outputs under 4 tokens
# (benchmark_serving_real.py lines 141-146). There is no limit on prompt + output.
GENERATED_MAX_OUTPUT = 8192

# LMSYS-Chat-1M averages 69.5 tokens a prompt and 214.5 a response, over all turns of its
# million conversations with 25 models (Zheng et al., arXiv:2309.11998, Table 1; the
# lmsys/lmsys-chat-1m dataset card). SuperInfer replays vllm-ltr's regeneration of it
# instead (lmsys-Meta-Llama-3-8B-Instruct-t1.0-s0-l8192-c10000: first user turns answered
# by Llama-3-8B-Instruct at temperature 1), whose lengths are not published: this is the
# dataset's published means under that trace's limits. Log-normal with sigma 1.0, as
# for ShareGPT: an assumption (no published spread).
LMSYS_PROMPT_MEAN = 69.5
LMSYS_OUTPUT_MEAN = 214.5


@dataclass(frozen=True)
class LogNormal:
    """Token counts drawn log-normal with mean ``mean`` and log-space spread ``sigma``."""

    mean: float
    sigma: float

    def __call__(self, rng: random.Random) -> int:
        mu = math.log(self.mean) - self.sigma**2 / 2
        return round(rng.lognormvariate(mu, self.sigma))


@dataclass(frozen=True)
class Percentiles:
    """Token counts drawn from a measured column by inverse CDF over its percentiles
    (``table`` and ``column`` in data/length_percentiles.json, at the file's ``levels``:
    every whole percent and, for the long tails, every tenth above 99), linear between
    neighbouring levels."""

    table: str
    column: str

    def __call__(self, rng: random.Random) -> int:
        levels, points = _percentile_points(self.table, self.column)
        u = rng.random() * 100
        i = bisect.bisect_right(levels, u) - 1
        share = (u - levels[i]) / (levels[i + 1] - levels[i])
        return round(points[i] + share * (points[i + 1] - points[i]))


@cache
def _percentile_points(table: str, column: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    doc = json.loads((DATA_DIR / "length_percentiles.json").read_text())
    levels = tuple(float(v) for v in doc["levels"])
    points = tuple(float(v) for v in doc[table][column])
    if levels[0] != 0 or levels[-1] != 100 or len(points) != len(levels):
        raise ValueError(f"{table}.{column}: percentiles do not span levels 0 to 100")
    if list(points) != sorted(points) or list(levels) != sorted(set(levels)):
        raise ValueError(f"{table}.{column}: percentiles are not ascending")
    return levels, points


@dataclass(frozen=True)
class TraceLengths:
    """``(prompt, output)`` pairs drawn from ``prompt`` then ``output``, independently,
    filtered the way a trace was: outputs cut at ``max_output`` tokens (generation
    stopped there), and pairs redrawn unless both have at least ``min_tokens``, the
    prompt at most ``max_prompt`` and the two together at most ``max_total``."""

    prompt: Callable[[random.Random], int]
    output: Callable[[random.Random], int]
    max_prompt: int | None = None
    max_output: int | None = None
    max_total: int | None = None
    min_tokens: int = MIN_TOKENS

    def __call__(self, rng: random.Random) -> tuple[int, int]:
        while True:
            prompt, output = self.prompt(rng), self.output(rng)
            if self.max_output is not None:
                output = min(output, self.max_output)
            if self.keeps(prompt, output):
                return prompt, output

    def keeps(self, prompt: int, output: int) -> bool:
        """Whether the filter keeps a pair (its output already cut at ``max_output``)."""
        return (
            prompt >= self.min_tokens
            and output >= self.min_tokens
            and (self.max_prompt is None or prompt <= self.max_prompt)
            and (self.max_total is None or prompt + output <= self.max_total)
        )


sharegpt_like = TraceLengths(
    LogNormal(SHAREGPT_PROMPT_MEAN, SHAREGPT_SIGMA),
    LogNormal(SHAREGPT_OUTPUT_MEAN, SHAREGPT_SIGMA),
    max_prompt=MAX_PROMPT_TOKENS,
    max_total=MAX_TOTAL_TOKENS,
)
"""A synthetic ShareGPT-like ``(prompt, output)`` pair (see the constants above); pairs
outside vLLM's benchmark filter are redrawn."""


@dataclass(frozen=True)
class Workload:
    """A named request-length distribution: what it draws and where its numbers come
    from."""

    name: str
    lengths: LengthSampler
    description: str
    sources: tuple[str, ...]


_CASTILLO = (
    "DanielFPerez/castillo_code@2d8f18e data/preprocessed/{test,validate}/"
    "preproc_ShareGPT_*_meta-llama--Llama-3.1-8B-Instruct.json (CASTILLO, arXiv:2505.16881)"
)
_LTR = "hao-ai-lab/vllm-ltr@13bbf6f benchmarks/benchmark_generate_dataset.py, README.md"

WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "sharegpt",
            sharegpt_like,
            "synthetic ShareGPT-like",
            ("Kwon et al., SOSP 2023, Fig. 11", "vLLM benchmarks/benchmark_serving.py"),
        ),
        # ShareGPT first turns answered by Llama-3-8B-Instruct, shaped like the trace
        # SuperInfer replays (vllm-ltr's llama3-8b-sharegpt-test-t1-s0-8192.jsonl:
        # temperature 1, up to 8,192 tokens, replayed with ignore_eos so a request decodes
        # what was generated: SuperInfer@790d1fad benchmarks/superinfer/sampler.py line
        # 117, api_client.py line 109). That trace's lengths are not published; these are
        # the nearest published measurement, CASTILLO's: Llama-3.1-8B-Instruct on 595
        # first turns of the same ShareGPT file, 10 samples each at temperature 0.6, top-p
        # 0.9: outputs median 536 tokens, mean 649, 1.65% above 2,048 and 0.44% above
        # 8,192 (runaways to its 15,000 cap). Its prompts count Llama 3.1's chat template
        # with its default system header (the shortest is 36 tokens). Prompt and output
        # are drawn independently: the pairing is not kept.
        Workload(
            "sharegpt-gen",
            TraceLengths(
                Percentiles("sharegpt-gen", "prompt_tokens"),
                Percentiles("sharegpt-gen", "output_tokens"),
                max_prompt=MAX_PROMPT_TOKENS,
                max_output=GENERATED_MAX_OUTPUT,
            ),
            "ShareGPT prompts with Llama-3-8B-class generated outputs up to 8,192 tokens",
            (_CASTILLO, _LTR),
        ),
        Workload(
            "lmsys",
            TraceLengths(
                LogNormal(LMSYS_PROMPT_MEAN, SHAREGPT_SIGMA),
                LogNormal(LMSYS_OUTPUT_MEAN, SHAREGPT_SIGMA),
                max_prompt=MAX_PROMPT_TOKENS,
                max_output=GENERATED_MAX_OUTPUT,
            ),
            "LMSYS-Chat-1M-like: its published mean prompt and response lengths",
            ("Zheng et al., arXiv:2309.11998, Table 1", _LTR),
        ),
        # Azure's 2023 traces' token counts as recorded (ContextTokens, GeneratedTokens),
        # unfiltered: code prompts median 1,469 / mean 2,048 tokens, outputs median 13 /
        # mean 28; conversation prompts median 1,020 / mean 1,155, outputs median 129 /
        # mean 211. Prompt and output drawn independently from their percentiles.
        *(
            Workload(
                f"azure-{kind}",
                TraceLengths(
                    Percentiles(f"azure-{kind}", "prompt_tokens"),
                    Percentiles(f"azure-{kind}", "output_tokens"),
                    min_tokens=1,
                ),
                f"Azure LLM inference trace ({kind}, 2023) token counts",
                (AZURE_TRACES.format(kind),),
            )
            for kind in ("code", "conv")
        ),
    )
}
DEFAULT_WORKLOAD = "sharegpt"


def get_workload(name: str, sharegpt: str | Path | None = None) -> Workload:
    """A ``WORKLOADS`` entry by name; refused beside a ShareGPT file (whose pairs replace
    a workload's lengths) unless it is the default."""
    try:
        workload = WORKLOADS[name]
    except KeyError:
        choices = ", ".join(WORKLOADS)
        raise ValueError(f"unknown workload {name!r}: choose from {choices}") from None
    if sharegpt is not None and name != DEFAULT_WORKLOAD:
        raise ValueError(
            f"a ShareGPT file (--sharegpt) replaces the {name} workload's lengths: give one"
        )
    return workload


def fixed_lengths(prompt_tokens: int, output_tokens: int) -> LengthSampler:
    """A sampler that always returns the same pair."""
    return lambda _rng: (prompt_tokens, output_tokens)


def resample(pairs: Sequence[tuple[int, int]]) -> LengthSampler:
    """A sampler drawing uniformly, with replacement, from ``pairs`` (e.g. a loaded file)."""
    if not pairs:
        raise ValueError("no length pairs to sample from")
    return lambda rng: pairs[rng.randrange(len(pairs))]
