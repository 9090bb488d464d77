"""``shunter bench serve``'s flags: ``vllm bench serve``'s names where the meaning is the
same (vllm-project/vllm, ``vllm/benchmarks/serve.py`` ``add_cli_args`` and
``datasets.py``), Shunter's own beside them. Only argparse at import time.

vLLM's flags taken as vLLM defines them: ``--backend``, ``--base-url``, ``--host``,
``--port``, ``--endpoint`` (a path, or ``chat``/``completions``), ``--header``,
``--model``, ``--tokenizer``, ``--request-rate`` (here also a comma list: one run per
rate), ``--num-prompts``, ``--burstiness``, ``--max-concurrency``, ``--seed``,
``--dataset-name``/``--dataset-path``, ``--random-input-len``/``--random-output-len``/
``--random-range-ratio``, ``--input-len``/``--output-len``, ``--ignore-eos``, the
sampling parameters, ``--extra-body``, ``--percentile-metrics``,
``--metric-percentiles``, ``--goodput``, ``--label``, ``--metadata``,
``--save-result``, ``--save-detailed``, ``--append-result``, ``--result-dir``,
``--result-filename``, ``--disable-tqdm`` (no progress bar is drawn either way).

Where the defaults differ: the dataset is the bundled ShareGPT sample (vLLM: random),
requests are greedy unless ``--temperature`` says otherwise (vLLM leaves it to the
server), and ``--ignore-eos`` is on for every dataset (vLLM: random only), since a
benchmark asks for lengths; ``--no-ignore-eos`` turns it off.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from shunter.engine.cliargs import comma_rates, positive_float, positive_int

BACKENDS = {"openai": "completions", "vllm": "completions", "openai-chat": "chat"}
ENDPOINTS = {
    "completions": "completions",
    "/v1/completions": "completions",
    "chat": "chat",
    "/v1/chat/completions": "chat",
}
SAMPLING = (
    ("--temperature", float),
    ("--top-p", float),
    ("--top-k", int),
    ("--min-p", float),
    ("--frequency-penalty", float),
    ("--presence-penalty", float),
    ("--repetition-penalty", float),
)


def _length(text: str) -> Any:
    from shunter.engine.workload.requests import WorkloadError
    from shunter.engine.workload.sources import LengthDist

    try:
        return LengthDist.parse(text)
    except WorkloadError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _pair(separator: str) -> Any:
    def parse(text: str) -> tuple[str, str]:
        key, sep, value = text.partition(separator)
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"expected KEY{separator}VALUE: {text!r}")
        return key.strip(), value.strip()

    return parse


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object: {text!r}")
    return value


def _comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def add_serve_parser(benches: argparse._SubParsersAction[Any]) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = benches.add_parser(
        "serve",
        help="load-test an OpenAI-compatible server at a list of request rates",
        description="Send a workload to an OpenAI-compatible server (Shunter's gateway, an "
        "engine, a vLLM server) open loop, at each rate of --request-rate, streaming, and "
        "report per rate: request and token throughput, TTFT / TPOT / ITL / E2E latency, "
        "TTFT, TBT and joint SLO attainment, goodput and errors. The flags are those of "
        "'vllm bench serve' where the meaning is the same, and --save-result writes its "
        "JSON document, one file per rate.",
    )
    target = p.add_argument_group("target")
    target.add_argument("--base-url", help="server URL (default http://HOST:PORT)")
    target.add_argument("--host", default="127.0.0.1")
    target.add_argument("--port", type=int, default=8000)
    target.add_argument("--backend", choices=tuple(BACKENDS), default="openai")
    target.add_argument(
        "--endpoint",
        choices=tuple(ENDPOINTS),
        help="API path (default: the backend's: /v1/completions, or /v1/chat/completions "
        "for openai-chat)",
    )
    target.add_argument("--model", required=True, help="model name sent with each request")
    target.add_argument("--served-model-name", help="accepted for vLLM's scripts; --model wins")
    target.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="bearer token (default: $OPENAI_API_KEY)",
    )
    target.add_argument("--header", type=_pair("="), nargs="*", default=[], metavar="KEY=VALUE")
    load = p.add_argument_group("load")
    load.add_argument(
        "--request-rate",
        "--rps",
        dest="rps",
        type=comma_rates,
        help="requests per second, or a comma list of rates, e.g. 1,2,4,8 (default inf: "
        "all at once); for a trace, optional: its times are scaled to each rate",
    )
    amount = load.add_mutually_exclusive_group()
    amount.add_argument("--duration", type=positive_float, help="seconds of arrivals per rate")
    amount.add_argument(
        "--num-prompts",
        "--num-requests",
        dest="num_requests",
        type=positive_int,
        help="requests per rate (default 1000, unless --duration or a trace)",
    )
    load.add_argument(
        "--burstiness",
        type=positive_float,
        default=1.0,
        help="gamma shape of the gaps between arrivals: 1 is Poisson (default), "
        "below 1 burstier, above 1 smoother",
    )
    load.add_argument("--max-concurrency", type=positive_int, help="cap on requests in flight")
    load.add_argument("--seed", type=int, default=0, help="seed of arrivals and sampling")
    load.add_argument(
        "--request-timeout",
        type=positive_float,
        default=600.0,
        help="seconds a response may stay silent before it counts as failed (default 600)",
    )
    load.add_argument("--disable-tqdm", action="store_true", help="accepted; no bar is drawn")
    data = p.add_argument_group("dataset")
    data.add_argument(
        "--dataset-name",
        choices=("sharegpt", "random", "synthetic", "prefix_repetition", "trace"),
        help="sharegpt (default: the bundled sample), random (synthetic lengths), "
        "prefix_repetition (shared prefixes, vLLM's), or trace (JSONL of arrival times and "
        "lengths); the file is --dataset-path",
    )
    data.add_argument("--dataset-path", type=Path)
    data.add_argument(
        "--dataset",
        help="Shunter's form, instead of --dataset-name/--dataset-path: sharegpt[:PATH], "
        "synthetic, or trace:PATH",
    )
    data.add_argument(
        "--input-len",
        type=_length,
        help="synthetic prompt tokens: N, LO..HI (uniform) or exp:MEAN (default 1024)",
    )
    data.add_argument("--output-len", type=_length, help="synthetic output tokens (default 128)")
    data.add_argument("--random-input-len", type=positive_int)
    data.add_argument("--random-output-len", type=positive_int)
    data.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="random lengths uniform within [len x (1 - r), len x (1 + r)] (default 0)",
    )
    for flag, default, meaning in (
        ("--prefix-repetition-prefix-len", 256, "words of each shared prefix"),
        ("--prefix-repetition-suffix-len", 256, "words after it, each request's own"),
        ("--prefix-repetition-num-prefixes", 10, "distinct prefixes"),
        ("--prefix-repetition-output-len", 128, "output tokens"),
    ):
        data.add_argument(
            flag,
            type=positive_int,
            default=default,
            help=f"prefix_repetition: {meaning} (default {default})",
        )
    data.add_argument(
        "--tokenizer",
        type=Path,
        metavar="MODEL_DIR",
        help="model directory whose tokenizer.json measures prompt and reply lengths "
        "(default: about four characters per token)",
    )
    request = p.add_argument_group("request")
    request.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask the server to generate every requested token (default on)",
    )
    for flag, kind in SAMPLING:
        request.add_argument(flag, type=kind)
    request.add_argument(
        "--extra-body", type=_json_object, help="JSON object merged into every request body"
    )
    score = p.add_argument_group("scoring")
    score.add_argument("--ttft-slo-ms", type=positive_float, default=5000.0, help="default 5000")
    score.add_argument("--tpot-slo-ms", type=positive_float, default=100.0, help="default 100")
    score.add_argument(
        "--goodput",
        type=_pair(":"),
        nargs="+",
        metavar="KEY:VALUE",
        help="goodput SLOs in ms, keys ttft, tpot, e2el (vLLM's); without it goodput "
        "counts requests within --ttft-slo-ms and --tpot-slo-ms",
    )
    score.add_argument(
        "--percentile-metrics",
        type=_comma_list,
        help="comma list among ttft,tpot,itl,e2el for the saved result (default ttft,tpot,itl)",
    )
    score.add_argument(
        "--metric-percentiles",
        type=_comma_list,
        help="comma list of percentiles for the saved result (default 99)",
    )
    out = p.add_argument_group("output")
    out.add_argument("--save-result", action="store_true", help="one vLLM result JSON per rate")
    out.add_argument("--save-detailed", action="store_true", help="with per-request arrays")
    out.add_argument("--append-result", action="store_true", help="append to the file")
    out.add_argument("--result-dir", type=Path, help="where results go (default: here)")
    out.add_argument("--result-filename", help="file name (several rates: -RATEqps added)")
    out.add_argument("--label", help="file name prefix and 'label' field (default: backend)")
    out.add_argument("--metadata", type=_pair("="), nargs="*", default=[], metavar="KEY=VALUE")
    out.add_argument(
        "--json", type=Path, metavar="PATH", help="every rate's report in one JSON document"
    )
    out.add_argument(
        "--save-requests", type=Path, metavar="CSV", help="write one CSV row per request"
    )
    return p
