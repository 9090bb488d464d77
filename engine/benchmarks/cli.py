"""The command lines of ``shunter bench executor`` and ``shunter bench remap-exec``."""

from __future__ import annotations

import argparse
from typing import Any

from shunter.engine.benchfigure import add_json_argument
from shunter.engine.cliargs import add_bench_arguments, comma_ints, positive_int, print_report


def add_bench_executor_parser(benches: argparse._SubParsersAction[Any]) -> None:
    """Add ``bench executor``: engine against transformers, and the cost of rotation."""
    p = benches.add_parser(
        "executor",
        help="CPU: engine tokens/s against transformers generate; KV rotation step cost",
        description="Write small-llama (random weights) to a temporary directory unless "
        "--model names one; (a) greedy output tokens/s of the engine against transformers' "
        "generate on the same batch of prompts, (b) wall time of a decode step with B KV "
        "blocks swapped each way against one with none. Host time on this machine.",
    )
    add_bench_arguments(p, preset="small-llama", prompt_tokens=64, max_tokens=32, device=True)
    p.add_argument("--prompts", type=positive_int, default=16, help="batch size (default 16)")
    p.add_argument(
        "--swap-blocks",
        type=positive_int,
        default=64,
        help="B: KV blocks swapped each way in the rotation step (default 64)",
    )
    p.set_defaults(func=cmd_bench_executor)


def cmd_bench_executor(ns: argparse.Namespace) -> int:
    from shunter.engine.benchmarks.executor import bench_executor

    return print_report(
        bench_executor(
            model_dir=ns.model,
            num_prompts=ns.prompts,
            prompt_tokens=ns.prompt_tokens,
            max_tokens=ns.max_tokens,
            swap_blocks=ns.swap_blocks,
            threads=ns.threads,
            device=ns.device,
        )
    )


def add_bench_pipeline_parser(benches: argparse._SubParsersAction[Any]) -> None:
    """Add ``bench pipeline``: async scheduling against the sequential step loop."""
    p = benches.add_parser(
        "pipeline",
        help="CPU: decode steps/s with async scheduling vs the sequential loop, alone and "
        "beside a CPU hog",
        description="Write tiny-llama (random weights) to a temporary directory unless "
        "--model names one, decode a batch through the engine with each step planned "
        "while the one before runs and with the sequential loop, alternated, and print "
        "steps/s, the host's share of the critical path, and each loop's throughput "
        "beside one busy process per core over its throughput alone. Host time on this "
        "machine.",
    )
    add_bench_arguments(
        p, preset="tiny-llama", prompt_tokens=64, max_tokens=128, threads=1, rounds=3, device=True
    )
    p.add_argument("--batch", type=positive_int, default=32, help="requests (default 32)")
    p.add_argument("--no-hog", action="store_true", help="skip the CPU-hog comparison")
    add_json_argument(p)
    p.set_defaults(func=cmd_bench_pipeline)


def cmd_bench_pipeline(ns: argparse.Namespace) -> int:
    from shunter.engine.benchmarks.pipeline import bench_pipeline

    return print_report(
        bench_pipeline(
            model_dir=ns.model,
            batch=ns.batch,
            prompt_tokens=ns.prompt_tokens,
            max_tokens=ns.max_tokens,
            rounds=ns.rounds,
            threads=ns.threads,
            hog=not ns.no_hog,
            device=ns.device,
        ),
        ns.json,
    )


def add_bench_graphs_parser(benches: argparse._SubParsersAction[Any]) -> None:
    """Add ``bench graphs``: a decode step replayed from CUDA graphs against eager."""
    p = benches.add_parser(
        "graphs",
        help="decode step time with CUDA graphs vs eager, against the HBM roofline",
        description="Write small-llama (random weights) to a temporary directory unless "
        "--model names one, and time decode steps of each batch size at --context tokens "
        "through the model: the eager pass against the static pass that replays CUDA "
        "graphs (on CUDA; elsewhere it runs eagerly), alternated, with the HBM roofline "
        "of the device's hardware profile. Host wall time, device synchronized each step.",
    )
    add_bench_arguments(p, preset="small-llama", rounds=3, device=True)
    p.add_argument(
        "--batches",
        type=comma_ints,
        default=(1, 16, 64, 256),
        metavar="B,B",
        help="batch sizes (default 1,16,64,256)",
    )
    p.add_argument(
        "--context", type=positive_int, default=512, help="tokens per request (default 512)"
    )
    p.add_argument(
        "--steps", type=positive_int, default=20, help="timed steps a round (default 20)"
    )
    p.set_defaults(func=cmd_bench_graphs)


def cmd_bench_graphs(ns: argparse.Namespace) -> int:
    from shunter.engine.benchmarks.graphs import bench_graphs

    return print_report(
        bench_graphs(
            model_dir=ns.model,
            batches=ns.batches,
            context=ns.context,
            steps=ns.steps,
            rounds=ns.rounds,
            threads=ns.threads,
            device=ns.device,
        )
    )


def add_bench_remap_exec_parser(benches: argparse._SubParsersAction[Any]) -> None:
    """Add ``bench remap-exec``: a decode step with k layers streamed against none."""
    p = benches.add_parser(
        "remap-exec",
        help="decode step time with k remapped layers streamed through slots vs none",
        description="Write small-llama (random weights) to a temporary directory unless "
        "--model names one, decode a batch with parameter remapping forced to k lent "
        "layers (each forward pass copies k+1 or k+2 layers into slots) and print the "
        "median step time against the same batch with none. Host time on this machine.",
    )
    add_bench_arguments(p, preset="small-llama", rounds=3, device=True)
    p.add_argument(
        "--lent",
        type=comma_ints,
        default=(1, 2, 4),
        metavar="K,K",
        help="lent layer counts to time (default 1,2,4)",
    )
    p.add_argument("--prompts", type=positive_int, default=8, help="batch size (default 8)")
    p.add_argument("--steps", type=positive_int, default=8, help="timed steps a round (default 8)")
    p.set_defaults(func=cmd_bench_remap_exec)


def cmd_bench_remap_exec(ns: argparse.Namespace) -> int:
    from shunter.engine.benchmarks.remap_exec import bench_remap_exec

    return print_report(
        bench_remap_exec(
            model_dir=ns.model,
            lent=ns.lent,
            num_prompts=ns.prompts,
            steps=ns.steps,
            rounds=ns.rounds,
            threads=ns.threads,
            device=ns.device,
        )
    )
