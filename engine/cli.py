"""Engine-side subcommands of ``shunter`` (simulate, bench, model, generate, engine, ...).

Imports nothing heavy at module level: ``shunter --help`` must stay fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

from shunter.engine.benchfigure import add_json_argument  # standard library only
from shunter.engine.cliargs import (  # argparse only
    comma_ints,
    comma_names,
    positive_float,
    positive_int,
    print_report,
    times,
)


def register(
    sub: argparse._SubParsersAction[Any],
    more_benches: Sequence[Callable[[argparse._SubParsersAction[Any]], None]] = (),
) -> None:
    """Add the engine's subcommands to the ``shunter`` parser, and each of
    ``more_benches`` (another package's ``shunter bench`` parsers, such as the
    gateway's) among the benchmarks: the engine imports no other package."""
    from shunter.engine.benchmarks.cli import (
        add_bench_executor_parser,
        add_bench_graphs_parser,
        add_bench_pipeline_parser,
        add_bench_remap_exec_parser,
    )
    from shunter.engine.calibrate.cli import add_calibrate_parser
    from shunter.engine.checkpoint.cli import add_model_parser
    from shunter.engine.generate.cli import add_generate_parser
    from shunter.engine.loadgen.cli import add_bench_parsers as add_loadgen_parsers
    from shunter.engine.server.cli import (
        add_bench_prefix_parser,
        add_bench_server_parser,
        add_engine_parser,
    )
    from shunter.engine.sim.cli import add_bench_simulator_parser, add_simulate_parser
    from shunter.kernels.cli import add_bench_kernels_parser

    add_simulate_parser(sub)
    bench = sub.add_parser(
        "bench",
        help="benchmarks (scheduler, remap, simulator, executor, server, gateway, ...) and "
        "`bench check`, which holds them to their targets",
    )
    benches = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    _add_bench_scheduler_parser(benches)
    _add_bench_remap_parser(benches)
    add_bench_simulator_parser(benches)
    add_bench_executor_parser(benches)
    add_bench_remap_exec_parser(benches)
    add_bench_pipeline_parser(benches)
    add_bench_graphs_parser(benches)
    add_bench_server_parser(benches)
    add_bench_prefix_parser(benches)
    _add_bench_isolation_parser(benches)
    for add_bench_parser in more_benches:
        add_bench_parser(benches)
    add_bench_kernels_parser(benches)
    add_loadgen_parsers(benches)
    _add_bench_check_parser(benches)
    add_model_parser(sub)
    add_generate_parser(sub)
    add_engine_parser(sub)
    add_calibrate_parser(sub)


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
        type=comma_ints,
        default=(256, 1024, 4096),
        help="comma list of live request counts (default 256,1024,4096)",
    )
    p.add_argument(
        "--steps", type=positive_int, default=100, help="timed steps per run (default 100)"
    )
    p.set_defaults(func=cmd_bench_scheduler)


def cmd_bench_scheduler(ns: argparse.Namespace) -> int:
    from shunter.engine.bench import bench_scheduler

    for line in bench_scheduler(ns.live, steps=ns.steps):
        print(line)
    return 0


def _add_bench_remap_parser(benches: argparse._SubParsersAction[Any]) -> None:
    p = benches.add_parser(
        "remap",
        help="median step planning time with 8 tenants, 1,024 live requests, remapping on",
        description="Keep 1,024 requests alive over eight Mistral-7B-shaped tenants (four "
        "spatial, four temporal) on a 144 GB GH200's memory, parameter remapping on, and "
        "time each step's planning: tenancy, the remapping controller and its memory "
        "verbs, and the scheduler. Under the default running cap, and with every live "
        "request allowed to run. Host time on this machine (target <= 1.5 ms).",
    )
    p.add_argument("--live", type=positive_int, default=1024, help="live requests (default 1024)")
    p.add_argument(
        "--steps", type=positive_int, default=60, help="timed steps per run (default 60)"
    )
    add_json_argument(p)
    p.set_defaults(func=cmd_bench_remap)


def cmd_bench_remap(ns: argparse.Namespace) -> int:
    from shunter.engine.bench import bench_remap

    return print_report(bench_remap(ns.live, steps=ns.steps), ns.json)


def _add_bench_check_parser(benches: argparse._SubParsersAction[Any]) -> None:
    from shunter.engine.benchcheck import BENCHES

    names = list(dict.fromkeys(b.name for b in BENCHES))
    p = benches.add_parser(
        "check",
        help="run the benchmarks of `make bench`; fail when a figure misses its target by "
        "more than its noise margin",
        description="Run each benchmark of `make bench` with its defaults, in its own "
        "process, its report streamed here; then print every figure held to a target "
        "(value, target, noise margin, verdict) and exit 1 when one misses its target by "
        "more than its margin, is missing, or a benchmark fails. Host wall time: run it "
        "on an idle machine.",
    )
    p.add_argument(
        "--only",
        type=comma_names,
        default=names,
        metavar="NAME,NAME",
        help=f"benchmarks to run (default all: {','.join(names)})",
    )
    p.set_defaults(func=cmd_bench_check)


def cmd_bench_check(ns: argparse.Namespace) -> int:
    from shunter.engine.benchcheck import run_check, select

    try:
        chosen = select(ns.only)
    except ValueError as e:
        print(f"shunter bench check: {e}", file=sys.stderr)
        return 2
    return run_check(chosen)


def _add_bench_isolation_parser(benches: argparse._SubParsersAction[Any]) -> None:
    p = benches.add_parser(
        "isolation",
        help="CPU: a quiet tenant's TTFT alone, beside 2,047-token prompts, beside max fan-out; "
        "with --on: a victim tenant beside an aggressor per variant, simulated or on an engine",
        description="Without --on: one engine serves two tiny-llama models; a quiet tenant "
        "streams short requests at a fixed rate alone, then while another tenant sends "
        "2,047-token prompts, then while it sends the largest fan-out the engine admits; "
        "prints the quiet tenant's TTFT P50/P99 and P99 against alone (target <= 1.5x), and "
        "the status of a 3,000 x n=8 request. Host wall time on this machine. "
        "With --on: a victim tenant (interactive SLO class) alone and beside an aggressor "
        "(batch class, 10x the victim's rate, long prompts) for each variant (vllm, lvf, "
        "lvf+, oneiros, combined, combined+): the victim's P99 TTFT and TBT beside against "
        "alone (target <= 1.5x) and its joint attainment beside (target >= 95%); 'sim' on "
        "the paper's scenarios (SIMULATED, spatial sharing), 'engine' on a real engine on "
        "this machine's CPU, 'both' one then the other.",
    )
    p.add_argument(
        "--on",
        choices=("sim", "engine", "both"),
        help="run the victim/aggressor comparison there (default: the quiet-tenant phases)",
    )
    p.add_argument(
        "--rate",
        type=positive_float,
        help="quiet or victim requests/s (default: 10 for the phases; on sim each "
        "scenario's, c1 0.5 and c2 0.2; on engine 0.5)",
    )
    p.add_argument(
        "--requests",
        type=positive_int,
        help="quiet requests a phase (default 60), or victim requests a phase on engine "
        "(default 20)",
    )
    p.add_argument(
        "--fanout",
        type=times,
        default=(16, 8),
        help="the noisy request's prompts x n (default 16x8: 128 sequences, the engine's bound)",
    )
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    p.add_argument(
        "--step-target-ms",
        type=positive_float,
        help="the engine's step target (default: half the tightest TBT SLO, 25 ms for the "
        "interactive class)",
    )
    p.add_argument(
        "--variants",
        type=comma_names,
        metavar="NAME,NAME",
        help="with --on: the variants (default vllm,lvf,lvf+,oneiros,combined,combined+; "
        "also lvf+shed, combined+shed)",
    )
    p.add_argument(
        "--scenario",
        type=comma_names,
        metavar="c1,c2",
        help="on sim: the paper's scenarios (default c1,c2)",
    )
    p.add_argument(
        "--duration",
        type=positive_float,
        default=120.0,
        help="on sim: seconds of arrivals (default 120)",
    )
    p.add_argument("--seed", type=int, default=0, help="with --on: arrivals' seed (default 0)")
    p.add_argument(
        "--layers",
        type=positive_int,
        default=2,
        help="on engine: decoder layers of both tiny models (default 2, the preset's; "
        "remapping lends layers beyond two)",
    )
    add_json_argument(p)
    p.set_defaults(func=cmd_bench_isolation)


def cmd_bench_isolation(ns: argparse.Namespace) -> int:
    if ns.on is None:
        from shunter.engine.server.bench_isolation import bench_isolation

        return print_report(
            bench_isolation(
                rate=10.0 if ns.rate is None else ns.rate,
                requests=60 if ns.requests is None else ns.requests,
                fanout=ns.fanout,
                threads=ns.threads,
                step_target_ms=ns.step_target_ms,
            ),
            ns.json,
        )
    from collections.abc import Iterable
    from itertools import chain

    from shunter.engine.benchfigure import ReportItem
    from shunter.engine.sim.isolation import (
        DEFAULT_VARIANTS,
        VARIANTS,
        IsolationSpec,
        bench_isolation_sim,
    )

    variants = ns.variants or DEFAULT_VARIANTS
    unknown = [v for v in variants if v not in VARIANTS]
    problems = []
    if unknown:
        problems.append(f"unknown variants {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    if any(v is not None and not v > 0 for v in (ns.rate, ns.step_target_ms)):
        problems.append("--rate and --step-target-ms must be positive")
    if ns.on != "sim" and (ns.layers < 1 or (ns.requests is not None and ns.requests < 1)):
        problems.append("--layers and --requests must be positive")
    reports: list[Iterable[ReportItem]] = []
    try:
        if problems:
            raise ValueError("; ".join(problems))
        if ns.on in ("sim", "both"):
            spec = IsolationSpec(
                scenarios=ns.scenario or IsolationSpec.scenarios,
                variants=variants,
                rate=ns.rate,
                duration_s=ns.duration,
                seed=ns.seed,
            )
            if ns.step_target_ms is not None:
                spec = dataclasses.replace(spec, step_target_s=ns.step_target_ms / 1000)
            reports.append(bench_isolation_sim(spec))
        if ns.on in ("engine", "both"):
            from shunter.engine.server.bench_isolation_variants import bench_isolation_variants

            reports.append(
                bench_isolation_variants(
                    variants=variants,
                    rate=0.5 if ns.rate is None else ns.rate,
                    requests=20 if ns.requests is None else ns.requests,
                    layers=ns.layers,
                    threads=ns.threads,
                    seed=ns.seed,
                    step_target_ms=ns.step_target_ms,
                )
            )
    except ValueError as e:
        print(f"shunter bench isolation: {e}", file=sys.stderr)
        return 2
    return print_report(chain.from_iterable(reports), ns.json)
