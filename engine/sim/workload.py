"""Workloads: request arrivals, request lengths, ShareGPT files and JSONL traces, and
the named ones (``WORKLOADS`` of lengths, ``ARRIVALS`` of arrival processes) built from
published figures.

Every random draw goes through a ``random.Random`` the caller seeds, so a workload is a
pure function of its arguments.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import random
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"


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
_AZURE_TRACES = "Azure/AzurePublicDataset@7909210 data/AzureLLMInferenceTrace_{}.csv"

ARRIVALS: dict[str, Arrivals] = {
    a.name: a
    for a in (
        Arrivals("poisson", 1.0, "Poisson: exponential gaps"),
        Arrivals(
            "azure-code",
            AZURE_CODE_CV,
            f"gamma gaps with the CV of Azure's coding trace, {AZURE_CODE_CV:g}",
            (_AZURE_TRACES.format("code"),),
        ),
        Arrivals(
            "azure-conv",
            AZURE_CONV_CV,
            f"gamma gaps with the CV of Azure's conversation trace, {AZURE_CONV_CV:g}",
            (_AZURE_TRACES.format("conv"),),
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
                (_AZURE_TRACES.format(kind),),
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


def lengths_from(sharegpt: str | Path | None, workload: str = DEFAULT_WORKLOAD) -> LengthSampler:
    """The named workload's lengths, or (given a file) pairs resampled from a
    ShareGPT-format file."""
    named = get_workload(workload, sharegpt)
    if sharegpt is None:
        return named.lengths
    return resample(load_sharegpt(sharegpt))


def estimate_tokens(text: str) -> int:
    """About four characters per token for English text (OpenAI's tokenizer guidance)."""
    return max(1, round(len(text) / 4))


def load_sharegpt(
    path: str | Path, count_tokens: Callable[[str], int] = estimate_tokens
) -> list[tuple[int, int]]:
    """``(prompt, output)`` token counts of a ShareGPT-format file's first exchanges
    (``sharegpt_exchanges``), as SuperInfer and vLLM's benchmark take them; pairs outside
    vLLM's length filter are skipped. ``count_tokens`` counts a text's tokens (pass a
    tokenizer's; the default estimates)."""
    pairs = []
    for prompt_text, reply_text in sharegpt_exchanges(path):
        prompt, output = count_tokens(prompt_text), count_tokens(reply_text)
        if sharegpt_like.keeps(prompt, output):
            pairs.append((prompt, output))
    return pairs


# The roles a ShareGPT turn of the user has, in the original dump and in later copies.
SHAREGPT_HUMAN = ("human", "user")


def sharegpt_exchanges(path: str | Path) -> list[tuple[str, str]]:
    """The first exchange of each conversation of a ShareGPT-format JSON file.

    The file is a list of ``{"conversations": [{"from": "human"|"gpt", "value": str},
    ...]}``. A conversation's first human turn is the prompt and the turn after it, if
    not another human one, the reply; conversations without such a pair give none.
    ValueError for a file that cannot be read or parsed, or an entry of another shape
    (naming it).
    """
    data = _read_json(path)
    if not isinstance(data, list):
        raise ValueError(
            f"{path}: a ShareGPT file is a JSON list of conversations, not {type(data).__name__}"
        )
    exchanges = []
    for i, item in enumerate(data):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise ValueError(f"{path}: entry {i}: expected an object with a 'conversations' list")
        for j, turn in enumerate(turns):
            if not (
                isinstance(turn, dict)
                and isinstance(turn.get("from"), str)
                and isinstance(turn.get("value"), str)
            ):
                raise ValueError(
                    f"{path}: entry {i}, turn {j}: expected {{'from': str, 'value': str}}"
                )
        for turn, reply in itertools.pairwise(turns):
            if turn["from"] in SHAREGPT_HUMAN:
                if reply["from"] not in SHAREGPT_HUMAN:
                    exchanges.append((turn["value"], reply["value"]))
                break
    return exchanges


def _read_json(path: str | Path) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None


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


@dataclass(frozen=True)
class TraceRow:
    """One line of a JSONL trace: arrival ``t`` (seconds), ``output_tokens``, and the
    prompt as text, as a token count or both; ``model`` where the trace names one.
    ``where`` is ``path:line`` for messages."""

    where: str
    t: float
    output_tokens: int
    prompt_tokens: int | None = None
    prompt: str | None = None
    model: str | None = None


def trace_rows(path: str | Path) -> list[TraceRow]:
    """Every request of a JSONL trace in file order, blank lines skipped: the one reader
    of the format the simulator writes (``write_trace``) and the load generator replays.
    ValueError naming the line for a malformed one, or for a file that cannot be read."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from None
    return [
        _trace_row(f"{path}:{lineno}", line)
        for lineno, line in enumerate(lines, start=1)
        if line.strip()
    ]


def _trace_row(where: str, line: str) -> TraceRow:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object")
    t = row.get("t")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
        raise ValueError(f"{where}: 't' must be a non-negative number of seconds")
    output = _positive_int(where, row, "output_tokens")
    if output is None:
        raise ValueError(f"{where}: 'output_tokens' must be a positive integer")
    prompt = row.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise ValueError(f"{where}: 'prompt' must be a non-empty string")
    model = row.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"{where}: 'model' must be a string")
    return TraceRow(
        where, float(t), output, _positive_int(where, row, "prompt_tokens"), prompt, model
    )


def _positive_int(where: str, row: dict[str, Any], key: str) -> int | None:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: '{key}' must be a positive integer")
    return value


def read_trace(path: str | Path) -> list[WorkloadRequest]:
    """A JSONL trace's requests sorted by arrival time; each line needs ``t``,
    ``prompt_tokens``, ``output_tokens`` and ``model`` (ValueError naming the line)."""
    requests = []
    for row in trace_rows(path):
        if row.prompt_tokens is None or row.model is None:
            raise ValueError(f"{row.where}: bad trace line: needs 'prompt_tokens' and 'model'")
        requests.append(WorkloadRequest(row.t, row.prompt_tokens, row.output_tokens, row.model))
    return sorted(requests, key=lambda r: r.t)


def load_trace(path: str | Path, models: Collection[str]) -> list[WorkloadRequest]:
    """``read_trace`` for a run serving ``models``: ValueError for a file that cannot be
    read, a trace without requests, or one naming a model the run does not serve."""
    try:
        requests = read_trace(path)
    except ValueError as exc:
        raise ValueError(f"cannot read trace {path}: {exc}") from None
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
