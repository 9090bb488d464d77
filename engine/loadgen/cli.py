"""``shunter bench serve`` (the load generator) and ``shunter bench loadgen`` (its own
benchmark). Only argparse at import time."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from shunter.engine.benchfigure import add_json_argument  # standard library only
from shunter.engine.cliargs import comma_rates, positive_float, positive_int, print_report

SAMPLE_SHAREGPT = Path(__file__).resolve().parent / "data" / "sample_sharegpt.json"


def add_bench_parsers(benches: argparse._SubParsersAction[Any]) -> None:
    """Add ``serve`` and ``loadgen`` to ``shunter bench``."""
    _add_serve_parser(benches)
    _add_loadgen_parser(benches)


def _length(text: str) -> Any:
    from shunter.engine.workload.requests import WorkloadError
    from shunter.engine.workload.sources import LengthDist

    try:
        return LengthDist.parse(text)
    except WorkloadError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_serve_parser(benches: argparse._SubParsersAction[Any]) -> None:
    p = benches.add_parser(
        "serve",
        help="load-test an OpenAI-compatible server at a list of request rates",
        description="Send a workload to an OpenAI-compatible server (Shunter's gateway, an "
        "engine, a vLLM server) open loop, at each rate of --rps for --duration seconds or "
        "--num-requests requests, streaming, and report per rate: request and token "
        "throughput, TTFT / TPOT / ITL / E2E latency (mean, median, P90, P99), TTFT, TBT "
        "and joint SLO attainment, goodput and errors. --json uses the field names of "
        "'vllm bench serve --save-result'.",
    )
    p.add_argument("--base-url", required=True, help="server URL, e.g. http://127.0.0.1:8100")
    p.add_argument("--model", required=True, help="model name sent with each request")
    p.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="bearer token (default: $OPENAI_API_KEY)",
    )
    p.add_argument("--endpoint", choices=("chat", "completions"), default="completions")
    p.add_argument(
        "--rps",
        type=comma_rates,
        help="comma list of request rates, e.g. 1,2,4,8 ('inf': all at once); "
        "for a trace, optional: its times are scaled to each rate",
    )
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--duration", type=positive_float, help="seconds of arrivals per rate")
    amount.add_argument("--num-requests", type=positive_int, help="requests per rate")
    p.add_argument(
        "--burstiness",
        type=positive_float,
        default=1.0,
        help="gamma shape of the gaps between arrivals: 1 is Poisson (default), "
        "below 1 burstier, above 1 smoother",
    )
    p.add_argument("--max-concurrency", type=positive_int, help="cap on requests in flight")
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals and sampling (default 0)")
    p.add_argument(
        "--dataset",
        default="sharegpt",
        help="sharegpt[:PATH] (default: the bundled sample), synthetic, or trace:PATH (JSONL)",
    )
    p.add_argument(
        "--input-len",
        type=_length,
        default="128",
        help="synthetic prompt tokens: N, LO..HI (uniform) or exp:MEAN (default 128)",
    )
    p.add_argument(
        "--output-len",
        type=_length,
        default="128",
        help="synthetic output tokens, same forms (default 128)",
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        metavar="MODEL_DIR",
        help="model directory whose tokenizer.json measures prompt and reply lengths "
        "(default: about four characters per token)",
    )
    p.add_argument("--ttft-slo-ms", type=positive_float, default=5000.0, help="default 5000")
    p.add_argument("--tpot-slo-ms", type=positive_float, default=100.0, help="default 100")
    p.add_argument(
        "--request-timeout",
        type=positive_float,
        default=600.0,
        help="seconds a response may stay silent before it counts as failed (default 600)",
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
    p.add_argument(
        "--save-requests", type=Path, metavar="CSV", help="write one CSV row per request"
    )
    p.set_defaults(func=cmd_bench_serve)


def cmd_bench_serve(ns: argparse.Namespace) -> int:
    from shunter.engine.loadgen.arrivals import ArrivalProcess
    from shunter.engine.loadgen.client import Target
    from shunter.engine.loadgen.report import Slo, format_report, write_csv
    from shunter.engine.loadgen.runner import RateResult, run_rate
    from shunter.engine.workload.requests import WorkloadError
    from shunter.engine.workload.sharegpt import sharegpt_workload
    from shunter.engine.workload.sources import SyntheticWorkload, TraceWorkload, Workload
    from shunter.engine.workload.tokens import token_counter
    from shunter.engine.workload.traces import trace_workload

    def fail(message: str) -> int:
        print(f"shunter bench serve: error: {message}", file=sys.stderr)
        return 2

    try:
        target = Target(ns.base_url, ns.model, ns.api_key, ns.endpoint)
        count = token_counter(ns.tokenizer) if ns.tokenizer else None
        kind, _, path = ns.dataset.partition(":")
        workload: Workload
        if kind == "sharegpt":
            workload = sharegpt_workload(path or SAMPLE_SHAREGPT, count)
        elif kind == "synthetic" and not path:
            workload = SyntheticWorkload(ns.input_len, ns.output_len, count)
        elif kind == "trace" and path:
            workload = trace_workload(path, count, seed=ns.seed)
        else:
            return fail(
                f"--dataset must be sharegpt[:PATH], synthetic or trace:PATH: {ns.dataset!r}"
            )
    except (ValueError, WorkloadError) as exc:
        return fail(str(exc))
    trace = isinstance(workload, TraceWorkload)
    if not trace and (ns.rps is None or (ns.duration is None and ns.num_requests is None)):
        return fail("--rps and one of --duration or --num-requests are needed (except for a trace)")
    if ns.duration is not None and any(math.isinf(r) for r in ns.rps or []):
        return fail("an infinite rate needs --num-requests, not --duration")
    slo = Slo(ns.ttft_slo_ms / 1000.0, ns.tpot_slo_ms / 1000.0)
    rates: list[float | None] = list(ns.rps) if ns.rps else [None]
    print(
        f"target {target.url} model {target.model}, workload {workload.name}, "
        f"{'trace times' if trace else f'burstiness {ns.burstiness:g}'}, seed {ns.seed}",
        flush=True,
    )
    results: list[RateResult] = []
    for rate in rates:
        result = run_rate(
            target,
            workload,
            rate,
            arrival=ArrivalProcess(ns.burstiness),
            num_requests=ns.num_requests,
            duration_s=ns.duration,
            max_concurrency=ns.max_concurrency,
            seed=ns.seed,
            slo=slo,
            request_timeout_s=ns.request_timeout,
        )
        results.append(result)
        print(format_report(result.report), flush=True)
    if len(results) > 1:
        print(format_rates(results))
    if ns.json:
        doc = {
            "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
            "endpoint_type": "openai-chat" if target.endpoint == "chat" else "openai",
            "base_url": target.base_url,
            "endpoint": target.url,
            "model_id": target.model,
            "tokenizer_id": str(ns.tokenizer) if ns.tokenizer else None,
            "dataset": workload.name,
            "seed": ns.seed,
            "results": [r.to_dict() for r in results],
        }
        ns.json.write_text(json.dumps(doc, indent=2) + "\n")
    if ns.save_requests:
        write_csv(ns.save_requests, (row for r in results for row in r.csv_rows()))
    if all(r.report.completed == 0 for r in results):
        print("shunter bench serve: every request failed", file=sys.stderr)
        return 1
    return 0


def format_rates(results: list[Any]) -> str:
    """One line per rate: the figures to compare across rates."""
    header = (
        f"{'rate':>7} {'req/s':>7} {'goodput':>8} {'tok/s':>8} {'TTFT p99':>9} "
        f"{'TPOT p99':>9} {'ITL p99':>8} {'TTFT%':>6} {'TBT%':>6} {'both%':>6} {'failed':>6}"
    )
    lines = [header, "-" * len(header)]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    for result in results:
        r = result.report
        lines.append(
            f"{r.request_rate:>7g} {r.request_throughput:>7.2f} {r.request_goodput:>8.2f} "
            f"{r.output_throughput:>8.1f} {ms(r.p99_ttft_ms):>9} {ms(r.p99_tpot_ms):>9} "
            f"{ms(r.p99_itl_ms):>8} {r.ttft_attainment:>6.1%} {r.tbt_attainment:>6.1%} "
            f"{r.slo_attainment:>6.1%} {r.failed:>6}"
        )
    return "\n".join(lines)


def _add_loadgen_parser(benches: argparse._SubParsersAction[Any]) -> None:
    p = benches.add_parser(
        "loadgen",
        help="the load generator's own rate and timing error against a local SSE fixture",
        description="Start the SSE fixture (fixed tokens, one per --itl-ms step) in its own "
        "process and drive it open loop with Poisson arrivals at --rps for --duration "
        "seconds: print the rate requests actually went out at and the generator's timing "
        "error (headers sent minus scheduled time) percentiles. Targets: >= 200 req/s with "
        "64 tokens per response, timing error P99 <= 5 ms.",
    )
    p.add_argument("--rps", type=positive_float, default=200.0, help="default 200")
    p.add_argument("--duration", type=positive_float, default=20.0, help="seconds (default 20)")
    p.add_argument("--tokens", type=positive_int, default=64, help="per response (default 64)")
    p.add_argument("--itl-ms", type=float, default=10.0, help="fixture step, ms (default 10)")
    p.add_argument("--seed", type=int, default=0)
    add_json_argument(p)
    p.set_defaults(func=cmd_bench_loadgen)


def cmd_bench_loadgen(ns: argparse.Namespace) -> int:
    from shunter.engine.loadgen.bench import bench_loadgen

    report = bench_loadgen(
        rate=ns.rps, duration_s=ns.duration, tokens=ns.tokens, itl_ms=ns.itl_ms, seed=ns.seed
    )
    return print_report(report, ns.json)
