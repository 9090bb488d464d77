"""Engine-side subcommands of ``shunter`` (simulate, bench, ...).

Imports nothing heavy at module level: ``shunter --help`` must stay fast.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the engine's subcommands to the ``shunter`` parser."""
    from shunter.engine.sim.cli import add_bench_simulator_parser, add_simulate_parser

    add_simulate_parser(sub)
    bench = sub.add_parser("bench", help="engine benchmarks (scheduler, simulator)")
    benches = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    _add_bench_scheduler_parser(benches)
    add_bench_simulator_parser(benches)


def _add_bench_scheduler_parser(benches: argparse._SubParsersAction[Any]) -> None:
    p = benches.add_parser(
        "scheduler",
        help="median step planning time, LVF against FCFS, by live requests",
        description="Keep N requests alive on Qwen2.5-32B with a 144 GB GH200's memory and "
        "time the scheduler's planning of each step (policy, memory verbs, batch, eager "
        "rotation) for LVF and FCFS. Host time on this machine.",
    )
    p.add_argument(
        "--live",
        type=lambda text: tuple(int(v) for v in text.split(",")),
        default=(256, 1024, 4096),
        help="comma list of live request counts (default 256,1024,4096)",
    )
    p.add_argument("--steps", type=int, default=100, help="timed steps per run (default 100)")
    p.set_defaults(func=cmd_bench_scheduler)


def cmd_bench_scheduler(ns: argparse.Namespace) -> int:
    from shunter.engine.bench import bench_scheduler

    for line in bench_scheduler(ns.live, steps=ns.steps):
        print(line)
    return 0
