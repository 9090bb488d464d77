"""``shunter bench gateway``'s arguments. Only argparse at import time."""

from __future__ import annotations

import argparse
from typing import Any

from shunter.engine.exec.cli import add_bench_arguments, print_report  # argparse only


def add_bench_gateway_parser(benches: argparse._SubParsersAction[Any]) -> None:
    p = benches.add_parser(
        "gateway",
        help="CPU: TTFT and ITL through the gateway against straight to the engine",
        description="Start a CPU engine on tiny-llama (random weights) unless --model names "
        "a directory, and a gateway in front of it on a throwaway embedded platform with "
        "one tenant key; stream the same greedy requests straight to the engine and through "
        "the gateway, --streams at a time, in alternated rounds. Prints median TTFT and ITL "
        "of both paths, their ratios and the median ITL the gateway adds. Host wall time.",
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
    p.add_argument("--streams", type=int, default=32, help="concurrent streams (default 32)")
    p.add_argument("--requests", type=int, default=32, help="requests per round (default 32)")
    p.set_defaults(func=cmd_bench_gateway)


def cmd_bench_gateway(ns: argparse.Namespace) -> int:
    from shunter.platform.gateway.bench import bench_gateway

    return print_report(
        bench_gateway(
            model_dir=ns.model,
            streams=ns.streams,
            requests=ns.requests,
            prompt_tokens=ns.prompt_tokens,
            max_tokens=ns.max_tokens,
            threads=ns.threads,
            rounds=ns.rounds,
        )
    )
