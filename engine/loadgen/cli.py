"""``shunter bench serve`` (the load generator) and ``shunter bench loadgen`` (its own
benchmark). Only argparse at import time."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from shunter.engine.benchfigure import add_json_argument  # standard library only
from shunter.engine.cliargs import positive_float, positive_int, print_report

SAMPLE_SHAREGPT = Path(__file__).resolve().parent / "data" / "sample_sharegpt.json"


def add_bench_parsers(benches: argparse._SubParsersAction[Any]) -> None:
    """Add ``serve`` and ``loadgen`` to ``shunter bench``."""
    _add_serve_parser(benches)
    _add_loadgen_parser(benches)


def _add_serve_parser(benches: argparse._SubParsersAction[Any]) -> None:
    from shunter.engine.loadgen.serve_cli import add_serve_parser

    add_serve_parser(benches).set_defaults(func=cmd_bench_serve)


def cmd_bench_serve(ns: argparse.Namespace) -> int:
    from shunter.engine.loadgen.arrivals import ArrivalProcess
    from shunter.engine.loadgen.report import Slo, format_report, write_csv
    from shunter.engine.loadgen.runner import RateResult, run_rate
    from shunter.engine.loadgen.serve_args import ServeArgs, ServeArgsError

    try:
        args = ServeArgs.of(ns, SAMPLE_SHAREGPT)
    except ServeArgsError as exc:
        print(f"shunter bench serve: error: {exc}", file=sys.stderr)
        return 2
    target, workload = args.target, args.workload
    print(
        f"target {target.url} model {target.model}, workload {workload.name}, "
        f"{'trace times' if args.trace else f'burstiness {ns.burstiness:g}'}, seed {ns.seed}",
        flush=True,
    )
    results: list[RateResult] = []
    for rate in args.rates:
        result = run_rate(
            target,
            workload,
            rate,
            arrival=ArrivalProcess(ns.burstiness),
            num_requests=args.num_requests,
            duration_s=ns.duration,
            max_concurrency=ns.max_concurrency,
            seed=ns.seed,
            slo=Slo(ns.ttft_slo_ms / 1000.0, ns.tpot_slo_ms / 1000.0),
            request_timeout_s=ns.request_timeout,
        )
        results.append(result)
        print(format_report(result.report), flush=True)
        if ns.save_result or ns.append_result:
            path = args.save(result, several=len(args.rates) > 1)
            print(f"saved {path}", flush=True)
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
        # What went wrong, once: the first failure's error says it for most runs (a model
        # name the server does not know, a parameter it refuses, no server at all).
        first = next((e for r in results for e in r.report.errors if e), "no error recorded")
        print(f"shunter bench serve: every request failed; the first: {first}", file=sys.stderr)
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
