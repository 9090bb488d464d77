"""``shunter bench gateway``'s arguments. Only argparse at import time."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

from shunter.engine.benchfigure import add_json_argument  # standard library only
from shunter.engine.cliargs import (  # argparse only
    add_bench_arguments,
    positive_float,
    positive_int,
    print_report,
    share,
)


def add_bench_gateway_parser(benches: argparse._SubParsersAction[Any]) -> None:
    p = benches.add_parser(
        "gateway",
        help="CPU: TTFT and ITL through the gateway against straight to the engine",
        description="Start a CPU engine on tiny-llama (random weights) unless --model names "
        "a directory, and a gateway in front of it with one tenant key, on the production "
        "path: PostgreSQL (a database created on $DATABASE_URL's server, default "
        "postgres://postgres@127.0.0.1:5432/shunter, named after it with _bench_gateway, "
        "dropped after the run) and Redis ($REDIS_URL, else redis://127.0.0.1:6379/15, "
        "which the run flushes); with --embedded, on a throwaway embedded platform (SQLite, "
        "in-process quotas). Streams the same greedy requests straight to the engine and "
        "through the gateway, --streams at a time, in alternated rounds, and prints which "
        "path was measured, median TTFT and ITL of both paths, their ratios and the median "
        "ITL the gateway adds (targets: TTFT ratio <= 1.10x, added median ITL <= 1 ms). "
        "Host wall time.",
    )
    add_bench_arguments(
        p,
        preset="tiny-llama",
        prompt_tokens=64,
        max_tokens=32,
        threads=1,
        threads_help="engine torch threads",
        rounds=3,
    )
    p.add_argument(
        "--streams", type=positive_int, default=32, help="concurrent streams (default 32)"
    )
    p.add_argument(
        "--requests", type=positive_int, default=32, help="requests per round (default 32)"
    )
    p.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        help="2 or more: serve the model on that many engines (nodes) and measure a steady "
        "load through the gateway with the first engine killed (SIGKILL) mid-run against "
        "none killed: served, failed and cut requests and P99 TTFT (target: no new request "
        "fails)",
    )
    p.add_argument(
        "--clients",
        type=positive_int,
        default=8,
        help="with --replicas: closed-loop clients (default 8)",
    )
    p.add_argument(
        "--duration",
        type=positive_float,
        default=20.0,
        help="with --replicas: seconds per phase (default 20)",
    )
    p.add_argument(
        "--kill-at",
        type=share,
        default=0.5,
        help="with --replicas: when the engine is killed, as a share of the phase (default 0.5)",
    )
    p.add_argument(
        "--embedded",
        action="store_true",
        help="run the gateway on the embedded platform (SQLite, in-process quotas) instead "
        "of PostgreSQL and Redis",
    )
    add_json_argument(p)
    p.set_defaults(func=cmd_bench_gateway)


def cmd_bench_gateway(ns: argparse.Namespace) -> int:
    from shunter.engine.benchfigure import ReportItem
    from shunter.gateway.bench import BenchError, bench_gateway
    from shunter.gateway.bench_failover import bench_gateway_failover

    report: Iterator[ReportItem]
    if ns.replicas >= 2:
        report = bench_gateway_failover(
            model_dir=ns.model,
            replicas=ns.replicas,
            clients=ns.clients,
            duration_s=ns.duration,
            kill_at=ns.kill_at,
            prompt_tokens=ns.prompt_tokens,
            max_tokens=ns.max_tokens,
            threads=ns.threads,
            embedded=ns.embedded,
        )
    else:
        report = bench_gateway(
            model_dir=ns.model,
            streams=ns.streams,
            requests=ns.requests,
            prompt_tokens=ns.prompt_tokens,
            max_tokens=ns.max_tokens,
            threads=ns.threads,
            rounds=ns.rounds,
            embedded=ns.embedded,
        )
    try:
        return print_report(report, ns.json)
    except BenchError as e:
        print(f"shunter bench gateway: {e}", file=sys.stderr)
        return 2
