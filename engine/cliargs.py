"""Argument types and helpers that the ``shunter`` command lines share.

Each type is an argparse ``type=`` callable: it returns the parsed value or raises
``ArgumentTypeError`` with a message naming what was expected, which argparse prints
beside the flag. Standard library only, so building the parser stays fast.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from shunter.engine.benchfigure import BenchFigure, ReportItem, write_figures

N = TypeVar("N", int, float)
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _checked(text: str, parse: Callable[[str], N], ok: Callable[[N], bool], expected: str) -> N:
    """``text`` read by ``parse`` if that value is ``ok``; else an ArgumentTypeError saying
    what was ``expected``."""
    try:
        value = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}: {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}: {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer above 0."""
    return _checked(text, int, lambda v: v > 0, "a positive integer")


def non_negative_int(text: str) -> int:
    """An integer of 0 or more."""
    return _checked(text, int, lambda v: v >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """A finite number above 0."""
    return _checked(text, float, lambda v: 0 < v < math.inf, "a positive number")


def non_negative_float(text: str) -> float:
    """A finite number of 0 or more."""
    return _checked(text, float, lambda v: 0 <= v < math.inf, "a number >= 0")


def share(text: str) -> float:
    """A number between 0 and 1, both excluded: ``0.5``."""
    return _checked(text, float, lambda v: 0 < v < 1, "a number between 0 and 1")


def byte_count(text: str) -> int:
    """``123456``, or with a binary suffix: ``64K``, ``1.5G`` (KiB, GiB), ``2MiB``."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = _UNITS.get(value[-1:], 1)
    number = value[:-1] if scale > 1 else value
    try:
        count = int(float(number) * scale)
    except (ValueError, OverflowError):  # not a number, or NaN or infinite
        raise argparse.ArgumentTypeError(f"expected a byte count such as 500M: {text!r}") from None
    if count <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive byte count: {text!r}")
    return count


def comma_ints(text: str) -> tuple[int, ...]:
    """A comma list of positive integers: ``1,32``."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected a comma list of positive integers such as 1,32: {text!r}"
        )
    return values


def times(text: str) -> tuple[int, int]:
    """Two positive integers joined by ``x``: ``16x8``."""
    left, _, right = text.partition("x")
    try:
        pair = (int(left), int(right))
    except ValueError:
        pair = (0, 0)
    if min(pair) <= 0:
        raise argparse.ArgumentTypeError(f"expected two positive integers such as 16x8: {text!r}")
    return pair


def comma_names(text: str) -> tuple[str, ...]:
    """A comma list of names, blanks around and between them dropped: ``lvf, fcfs``."""
    return tuple(v.strip() for v in text.split(",") if v.strip())


def comma_rates(text: str) -> list[float]:
    """A comma list of request rates, each above 0 (``inf``: all at once): ``1,2,4,8``."""
    try:
        rates = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected rates such as 1,2,4,8 or inf: {text!r}"
        ) from None
    if not rates or any(not r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"rates must be positive: {text!r}")
    return rates


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
