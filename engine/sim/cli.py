"""``shunter simulate`` and ``shunter bench simulator``.

Only argparse at import time: the simulator loads when a command runs, so
``shunter --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shunter.engine.cliargs import comma_names, comma_rates, positive_float
from shunter.engine.config import CAPACITY_SOURCES, POLICIES, SchedulerConfig

DEFAULTS = SchedulerConfig()


def add_simulate_parser(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``simulate``: policies x request rates on a simulated GPU."""
    p = sub.add_parser(
        "simulate",
        help="run the engine core on simulated hardware (results are SIMULATED)",
        description="Run the real scheduler and memory manager on a virtual clock with a "
        "roofline cost model of public hardware and model facts, for each policy and "
        "request rate, and print SLO attainment and latency. Every figure is SIMULATED.",
    )
    p.add_argument("--model", default="qwen2.5-32b", help="catalog model (default qwen2.5-32b)")
    p.add_argument(
        "--hardware",
        help="gh200 (default), gh200-96g (a scenario's default), h200, h100 or a profile JSON",
    )
    p.add_argument(
        "--policy",
        type=comma_names,
        default=["lvf", "fcfs", "wf", "sf"],
        help=f"comma list of policies ({', '.join(POLICIES)}) and baselines (vllm: vLLM 0.6.6's "
        "V1 engine, recompute preemption; superinfer: LVF with SuperInfer's settings)",
    )
    p.add_argument(
        "--rps",
        type=comma_rates,
        help="comma list, req/s (default 4,8,12,16,20; with --scenario, per model while it "
        "receives requests, default 2,4,8,16)",
    )
    p.add_argument("--duration", type=float, help="seconds of arrivals (default 120)")
    p.add_argument("--ttft-slo", type=float, default=5.0, help="S_F, seconds (default 5)")
    p.add_argument("--tbt-slo", type=float, default=0.1, help="S_B, seconds (default 0.1)")
    p.add_argument("--alpha", type=float, default=3.0, help="VLT alpha (default 3)")
    p.add_argument("--beta-b", type=float, default=0.0, help="VLT beta_B (default 0)")
    p.add_argument("--beta-f", type=float, default=0.5, help="VLT beta_F (default 0.5)")
    p.add_argument(
        "--xfer-budget",
        type=int,
        help="B_xfer, blocks per step (default: what the host link moves within a step, "
        "each step; a baseline's own, superinfer 2400; with --scenario, as many bytes as "
        "that many 4 MiB blocks)",
    )
    p.add_argument(
        "--swap-bandwidth-scale",
        type=float,
        default=1.0,
        help="scale every host<->device bandwidth (0.05: a slow transfer engine)",
    )
    p.add_argument(
        "--max-running",
        type=int,
        help=f"cap on running requests (default {DEFAULTS.max_running}; a baseline's own)",
    )
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        help=f"tokens per step (default {DEFAULTS.max_batch_tokens}; a baseline's own)",
    )
    p.add_argument(
        "--cv",
        type=float,
        default=1.0,
        help="arrival burstiness: gamma CV (1 = Poisson); the same as --arrivals gamma:CV",
    )
    p.add_argument(
        "--arrivals",
        metavar="PROCESS",
        help="gaps between arrivals: poisson (default), gamma:CV, or azure-code / azure-conv "
        "(gamma gaps with the CV of Azure's 2023 LLM inference traces)",
    )
    p.add_argument(
        "--workload",
        metavar="NAME",
        help="request lengths: sharegpt (default; vLLM's benchmark filter), sharegpt-gen "
        "(ShareGPT prompts, Llama-3-8B-class outputs up to 8,192 tokens), lmsys "
        "(LMSYS-Chat-1M's mean lengths), azure-code or azure-conv (Azure's trace lengths)",
    )
    p.add_argument(
        "--sharegpt",
        metavar="FILE",
        help="draw lengths from a ShareGPT JSON file instead of the synthetic distribution",
    )
    p.add_argument(
        "--trace",
        metavar="FILE",
        help='replay a JSONL trace, one {"t", "prompt_tokens", "output_tokens", "model"} per '
        "line, instead of generating requests (replaces --rps, --duration, --cv, --arrivals, "
        "--workload, --sharegpt)",
    )
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--json", metavar="OUT", help="write results as JSON")
    p.add_argument("--plot", metavar="OUT", help="write attainment vs rate as HTML")
    p.add_argument(
        "--validate",
        action="store_true",
        help="print the cost model against the measured and published figures it was "
        "calibrated on and held out from, with each error (SIMULATED), and exit; "
        "--duration sets its simulated run's seconds of arrivals (default 120), --json "
        "writes the table",
    )
    p.add_argument(
        "--paper",
        choices=["superinfer", "oneiros"],
        help="run a paper's own evaluation settings and print each simulated figure "
        "beside the published one (SIMULATED): superinfer (§5.2, Fig. 16: vllm against "
        "superinfer) or oneiros (§7.2-7.3: c1 and c2, none against oneiros); only "
        "--duration (default 120), --seed and --json apply",
    )
    t = p.add_argument_group(
        "multi-tenant scenarios",
        "--scenario replaces --model and --policy: the paper's model combinations, each "
        "model with its share of GPU memory, compared as variants",
    )
    t.add_argument("--scenario", choices=["c1", "c2"], help="c1 or c2 (Oneiros Table 1)")
    t.add_argument(
        "--sharing",
        type=comma_names,
        default=["temporal"],
        help="temporal and/or spatial, comma list (default temporal)",
    )
    t.add_argument(
        "--variant",
        type=comma_names,
        default=["none", "oneiros", "rotasched", "combined"],
        help="comma list of none, oneiros, rotasched, combined (default those four), and "
        "rotasched+, combined+ (the same two with lvf+), rotasched+shed, combined+shed (with "
        "lvf+shed)",
    )
    t.add_argument(
        "--window", type=float, default=30.0, help="temporal: seconds each model is on per cycle"
    )
    t.add_argument(
        "--quantum", type=float, default=0.5, help="least seconds a temporal turn is held"
    )
    t.add_argument("--remap-cap", type=float, default=0.5, help="most of a model's layers remapped")
    t.add_argument(
        "--capacity-order",
        type=comma_names,
        default=CAPACITY_SOURCES,
        help="order memory is taken in (default " + ",".join(CAPACITY_SOURCES) + ")",
    )
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(ns: argparse.Namespace) -> int:
    # A configuration the engine refuses (weights that do not fit the profile's memory,
    # bad knobs) is a ValueError raised before anything is simulated: say it, exit 2.
    try:
        if ns.validate:
            return _validate(ns)
        if ns.paper:
            from shunter.engine.sim.paper import run_paper

            if ns.scenario or ns.trace or ns.rps:
                raise ValueError(
                    "--paper runs the paper's own settings: drop --scenario, --trace, --rps"
                )
            return run_paper(ns.paper, duration_s=ns.duration, seed=ns.seed, json_path=ns.json)
        return _simulate_scenario(ns) if ns.scenario else _simulate_sweep(ns)
    except ValueError as e:
        print(f"shunter simulate: {e}", file=sys.stderr)
        return 2


def _validate(ns: argparse.Namespace) -> int:
    from shunter.engine.sim.validate import DEFAULT_DURATION_S, run_validate

    duration = DEFAULT_DURATION_S if ns.duration is None else ns.duration
    return run_validate(duration_s=duration, json_path=ns.json)


def _arrivals(
    ns: argparse.Namespace, models: list[str], rates: tuple[float, ...]
) -> tuple[tuple[float, ...], float]:
    """The rates and seconds of arrivals to simulate: as asked, or with ``--trace`` the
    trace's own (its mean rate, up to its last arrival), refusing the knobs it replaces."""
    if ns.trace is None:
        return tuple(ns.rps or rates), 120.0 if ns.duration is None else ns.duration
    from shunter.engine.workload.traces import load_trace, trace_window

    given = [
        flag
        for flag, value in (
            ("--rps", ns.rps),
            ("--duration", ns.duration),
            ("--sharegpt", ns.sharegpt),
            ("--workload", ns.workload),
            ("--arrivals", ns.arrivals),
        )
        if value is not None
    ]
    if ns.cv != 1.0:
        given.append("--cv")
    if given:
        raise ValueError(f"--trace replays its own arrivals and lengths: drop {', '.join(given)}")
    window, rate = trace_window(load_trace(ns.trace, models))
    return (rate,), window


def _generated(ns: argparse.Namespace) -> dict[str, Any]:
    """The spec's knobs for generated requests; a spec's defaults where none is given."""
    named = {"workload_name": ns.workload, "arrivals": ns.arrivals}
    return {"cv": ns.cv, "sharegpt": ns.sharegpt} | {
        k: v for k, v in named.items() if v is not None
    }


def _simulate_sweep(ns: argparse.Namespace) -> int:
    from shunter.engine.sim.sweep import SweepSpec, run_sweep

    rates, duration = _arrivals(ns, [ns.model], (4.0, 8.0, 12.0, 16.0, 20.0))
    spec = SweepSpec(
        model=ns.model,
        hardware=ns.hardware or "gh200",
        policies=tuple(ns.policy),
        rates=rates,
        duration_s=duration,
        ttft_slo_s=ns.ttft_slo,
        tbt_slo_s=ns.tbt_slo,
        alpha=ns.alpha,
        beta_b=ns.beta_b,
        beta_f=ns.beta_f,
        xfer_budget=ns.xfer_budget,
        swap_bandwidth_scale=ns.swap_bandwidth_scale,
        max_running=ns.max_running,
        max_batch_tokens=ns.max_batch_tokens,
        **_generated(ns),
        trace=ns.trace,
        seed=ns.seed,
    )
    return run_sweep(spec, json_path=ns.json, plot_path=ns.plot)


def _simulate_scenario(ns: argparse.Namespace) -> int:
    from shunter.engine.sim.scenario import get_scenario
    from shunter.engine.sim.scenario_sweep import ScenarioSpec, run_scenarios

    models = [name for name, _ in get_scenario(ns.scenario).shares]
    rates, duration = _arrivals(ns, models, (2.0, 4.0, 8.0, 16.0))
    spec = ScenarioSpec(
        scenario=ns.scenario,
        sharing=tuple(ns.sharing),
        variants=tuple(ns.variant),
        rates=rates,
        duration_s=duration,
        window_s=ns.window,
        hardware=ns.hardware,
        ttft_slo_s=ns.ttft_slo,
        tbt_slo_s=ns.tbt_slo,
        alpha=ns.alpha,
        beta_b=ns.beta_b,
        beta_f=ns.beta_f,
        xfer_budget=ns.xfer_budget,
        swap_bandwidth_scale=ns.swap_bandwidth_scale,
        max_running=DEFAULTS.max_running if ns.max_running is None else ns.max_running,
        max_batch_tokens=(
            DEFAULTS.max_batch_tokens if ns.max_batch_tokens is None else ns.max_batch_tokens
        ),
        turn_quantum_s=ns.quantum,
        remap_cap=ns.remap_cap,
        capacity_order=ns.capacity_order,
        **_generated(ns),
        trace=ns.trace,
        seed=ns.seed,
    )
    return run_scenarios(spec, json_path=ns.json, plot_path=ns.plot)


def add_bench_simulator_parser(bench_sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``bench simulator``: simulated seconds per wall second."""
    p = bench_sub.add_parser(
        "simulator",
        help="simulator speed: simulated seconds per wall second (target >= 20)",
        description="Times `shunter simulate --model qwen2.5-32b --hardware gh200 "
        "--policy lvf,fcfs,wf,sf --rps 20 --duration 120` and reports simulated seconds "
        "per wall second, per policy and overall.",
    )
    p.add_argument("--rps", type=positive_float, default=20.0)
    p.add_argument("--duration", type=positive_float, default=120.0)
    p.add_argument("--policy", type=comma_names, default=["lvf", "fcfs", "wf", "sf"])
    p.set_defaults(func=cmd_bench_simulator)


def cmd_bench_simulator(ns: argparse.Namespace) -> int:
    from shunter.engine.sim.sweep import bench_simulator

    return bench_simulator(rate=ns.rps, duration_s=ns.duration, policies=ns.policy)
