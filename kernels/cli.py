"""``shunter bench kernels``: the Triton kernels against their torch references."""

from __future__ import annotations

import argparse
from typing import Any


def add_bench_kernels_parser(benches: argparse._SubParsersAction[Any]) -> None:
    """Add ``bench kernels`` to the ``bench`` subcommands."""
    p = benches.add_parser(
        "kernels",
        help="GPU: Triton paged attention, write_kv and block copies against torch",
        description="On one layer of a llama-3-8b-shaped cache (bf16, 16-token blocks): "
        "decode attention at batch 1, 16, 64, 256 (context 1k) and one 32k context "
        "(split-K), prefill chunks, write_kv, and the gather/scatter of 2 MiB blocks; "
        "each Triton kernel against its torch reference in the same run, as GB/s (or "
        "TFLOP/s) and as a share of the measured device copy bandwidth. Needs a CUDA "
        "device; without one it says so and measures nothing.",
    )
    p.set_defaults(func=cmd_bench_kernels)


def cmd_bench_kernels(ns: argparse.Namespace) -> int:
    import torch

    from shunter.kernels.ops import triton_importable

    if not torch.cuda.is_available():
        print("bench kernels: no CUDA device here; nothing measured")
        return 0
    if not triton_importable():
        print("bench kernels: Triton does not import here; nothing measured")
        return 0
    from shunter.kernels.bench import bench_kernels

    for line in bench_kernels(device=torch.device("cuda")):
        print(line, flush=True)
    return 0
