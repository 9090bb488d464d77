"""``shunter engine calibrate``: argparse only at import time (``shunter --help`` stays
fast); the measuring code loads when the command runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_calibrate_parser(sub: argparse._SubParsersAction[Any]) -> None:
    """Give ``shunter engine``, already among ``sub``'s commands, its ``calibrate``
    subcommand (``shunter engine`` alone still serves)."""
    engine: argparse.ArgumentParser = sub.choices["engine"]
    actions = engine.add_subparsers(dest="engine_command", metavar="ACTION")
    p = actions.add_parser(
        "calibrate",
        help="measure this machine and write a hardware profile JSON",
        description="Measure host-to-device, device-to-host and full-duplex copy "
        "bandwidth by copy size and the per-copy launch cost, device memory bandwidth "
        "and dense GEMM throughput, and each --model's per-layer compute time by decode "
        "batch and context and by prefill chunk, on the executor's own forward pass. "
        "Writes a profile that `shunter simulate --hardware FILE` reads, with the "
        "remapping controller's per-model timings under 'calibration'. Every figure is "
        "MEASURED on this machine (on CPU, host<->device copies are memcpy).",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="DIR",
        help="a model directory (e.g. from `shunter model init`) to time; repeatable",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("profile.json"),
        help="profile to write, a .json file (default profile.json)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small copies (up to 16 MiB), small shapes and fewer repeats: seconds on a CPU",
    )
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(ns: argparse.Namespace) -> int:
    from shunter.engine.calibrate.run import CalibrationError, run_calibrate

    try:
        run_calibrate(
            device_name=ns.device,
            models=ns.model,
            out=ns.out,
            quick=ns.quick,
            say=lambda line: print(line, flush=True),
        )
    except CalibrationError as e:
        print(f"shunter engine calibrate: {e}", file=sys.stderr)
        return 2
    return 0
