"""A benchmark's figures and their targets, in a form a program can read.

A benchmark with a target yields, between its report lines, one ``BenchFigure`` per
figure it holds to a target; the lines are printed as they come and, given ``--json
PATH``, the figures are written there (``shunter bench check`` reads them). Only the
standard library here: the bench commands' parsers import it.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

Direction = Literal["<=", ">="]
DIRECTIONS: tuple[Direction, ...] = ("<=", ">=")


@dataclass(frozen=True)
class BenchFigure:
    """One measured ``value`` and the ``target`` it should meet: at most the target
    (``direction`` "<=") or at least it (">="), both in ``unit``. Targets are positive,
    so a noise margin is a share of the target."""

    name: str
    value: float
    target: float
    direction: Direction
    unit: str

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"{self.name}: direction must be <= or >=, not {self.direction!r}")
        if not self.target > 0:
            raise ValueError(f"{self.name}: the target must be positive, not {self.target}")

    def bound(self, margin: float) -> float:
        """The worst value that still passes with a noise ``margin`` (a share of the target)."""
        return self.target * (1 + margin if self.direction == "<=" else 1 - margin)

    def meets(self, limit: float) -> bool:
        """Whether the value is on the right side of ``limit`` (the target, or a bound);
        a value that is not a number never is."""
        if not math.isfinite(self.value):
            return False
        return self.value <= limit if self.direction == "<=" else self.value >= limit


ReportItem = str | BenchFigure


def split_report(items: Iterable[ReportItem]) -> tuple[list[str], list[BenchFigure]]:
    """A report's lines and its figures, each in order."""
    lines: list[str] = []
    figures: list[BenchFigure] = []
    for item in items:
        if isinstance(item, BenchFigure):
            figures.append(item)
        else:
            lines.append(item)
    return lines, figures


def write_figures(path: Path, figures: Sequence[BenchFigure]) -> None:
    """``{"figures": [{name, value, target, direction, unit}, ...]}`` to ``path``."""
    path.write_text(json.dumps({"figures": [asdict(f) for f in figures]}, indent=2) + "\n")


def read_figures(path: Path) -> list[BenchFigure]:
    """The figures ``write_figures`` wrote to ``path``. ValueError: not such a file."""
    try:
        return [BenchFigure(**entry) for entry in json.loads(path.read_text())["figures"]]
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a figures file ({e})") from None


def add_json_argument(p: argparse.ArgumentParser) -> None:
    """Add ``--json PATH``: where a bench command writes its figures."""
    p.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="also write the figures held to a target, with the targets, to PATH as JSON "
        "(what `shunter bench check` reads)",
    )
