"""``shunter generate`` and ``shunter bench executor``.

Only argparse and pure engine logic at import time: torch and the models load when a
command runs, so ``shunter --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from shunter.engine.benchfigure import BenchFigure, ReportItem, write_figures
from shunter.engine.exec.forced_remap import EVERY_LAYER

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def byte_count(text: str) -> int:
    """``123456``, or with a binary suffix: ``64K``, ``1.5G`` (KiB, GiB), ``2MiB``."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = _UNITS.get(value[-1:], 1)
    number = value[:-1] if scale > 1 else value
    try:
        count = int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a byte count such as 500M: {text!r}") from None
    if count <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive byte count: {text!r}")
    return count


def _token_ids(text: str) -> list[int]:
    try:
        ids = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected token ids such as 1,2,3: {text!r}") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"expected token ids >= 0 such as 1,2,3: {text!r}")
    return ids


def positive_int(text: str) -> int:
    """An argparse type: an integer above 0."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer: {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0: {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number: {text!r}")
    return value


def add_bench_arguments(
    p: argparse.ArgumentParser,
    *,
    preset: str,
    prompt_tokens: int | None = None,
    max_tokens: int | None = None,
    threads: int | None = None,
    threads_help: str = "torch threads",
    rounds: int | None = None,
    device: bool = False,
) -> None:
    """Add the options the benchmarks share: ``--model`` (a model directory; default: the
    ``preset`` written with random weights), ``--threads`` (default ``threads``; None: every
    core), each of ``--prompt-tokens``, ``--max-tokens`` and ``--rounds`` (alternated
    rounds) that is given a default here, and ``--device`` (cpu or cuda, default cpu)
    when ``device``. Every count must be a positive integer."""
    p.add_argument("--model", type=Path, help=f"a model directory (default: {preset})")
    threads_default = f"default {threads}" if threads else "default: every core"
    p.add_argument(
        "--threads",
        type=positive_int,
        default=threads,
        help=f"{threads_help} ({threads_default})",
    )
    counts = (
        ("--prompt-tokens", prompt_tokens, "tokens per prompt"),
        ("--max-tokens", max_tokens, "output tokens per request"),
        ("--rounds", rounds, "alternated rounds"),
    )
    for flag, default, meaning in counts:
        if default is not None:
            p.add_argument(
                flag, type=positive_int, default=default, help=f"{meaning} (default {default})"
            )
    if device:
        p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default cpu")


def print_report(items: Iterable[ReportItem], json_path: Path | None = None) -> int:
    """Print a benchmark's report lines as they come and, with ``json_path``, write the
    figures it yielded there at the end; the command's exit status (0)."""
    figures = []
    for item in items:
        if isinstance(item, BenchFigure):
            figures.append(item)
        else:
            print(item, flush=True)
    if json_path is not None:
        write_figures(json_path, figures)
    return 0


def add_generate_parser(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``generate``: serve prompts offline through EngineCore and the torch executor."""
    p = sub.add_parser(
        "generate",
        help="generate tokens offline with the engine (real models, no server)",
        description="Run the engine core with the torch executor over Hugging Face model "
        "directories and print each request's tokens and text. A prompt given with "
        "--prompt or --prompt-ids goes to every model; --requests runs a JSON Lines file "
        '(one {"model", "prompt_ids" or "prompt", "max_tokens"} object per line) with '
        "all requests concurrent.",
    )
    p.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="[NAME=]DIR",
        help="a model directory, named NAME (default: the directory's name); repeatable",
    )
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", metavar="TEXT", help="a text prompt, tokenized per model")
    prompt.add_argument(
        "--prompt-ids", type=_token_ids, metavar="1,2,3", help="a prompt as token ids"
    )
    prompt.add_argument(
        "--requests", type=Path, metavar="FILE.jsonl", help="one JSON request per line"
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        required=True,
        metavar="N",
        help="output tokens per request (--requests: for lines without max_tokens)",
    )
    sampling = p.add_mutually_exclusive_group()
    sampling.add_argument("--greedy", action="store_true", help="always the most likely token")
    sampling.add_argument(
        "--temperature",
        type=_positive_float,
        default=1.0,
        metavar="T",
        help="sampling temperature (default 1.0)",
    )
    p.add_argument("--seed", type=int, metavar="S", help="seed of every request's sampler")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="where the models run (default: cuda when available, else cpu)",
    )
    p.add_argument(
        "--hbm-budget",
        type=byte_count,
        metavar="BYTES",
        help="device arena size: weights plus KV (e.g. 500M); default: room for every "
        "request at full length. Pages are 2 MiB, or the largest KV block rounded up to a "
        "power of two when smaller",
    )
    p.add_argument(
        "--force-rotation",
        action="store_true",
        help="rotate requests' KV to host and back after every step they run, and copy "
        "every full block to host at once",
    )
    p.add_argument(
        "--remap",
        action="store_true",
        help="lend decoder layers' weight memory to the KV cache under memory pressure "
        "(parameter remapping): their layers stream from host memory during forward passes",
    )
    p.add_argument(
        "--force-remap",
        nargs="?",
        const=EVERY_LAYER,
        type=_count,
        metavar="N",
        help="remap N layers of every model whatever the pressure (without N: all it can), "
        "at most its layers less 2, so a 2-layer model lends none; implies --remap",
    )
    p.add_argument(
        "--force-remap-inactive",
        action="store_true",
        help="with --force-remap: only models not executing (temporal models without "
        "the turn) lend their layers",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print JSON lines: one object per request in input order, then a summary",
    )
    p.set_defaults(func=cmd_generate)


def cmd_generate(ns: argparse.Namespace) -> int:
    from shunter.engine.exec.generate import format_json, format_text, generate_from_args
    from shunter.engine.exec.generate_input import GenerateError

    try:
        result = generate_from_args(ns)
    except GenerateError as e:
        print(f"shunter generate: error: {e}", file=sys.stderr)
        return 2
    for warning in result.warnings:
        print(f"shunter generate: warning: {warning}", file=sys.stderr)
    for line in (format_json if ns.json else format_text)(result):
        print(line)
    return 0
