"""The command lines' argument types: a number out of range is a usage error (exit 2,
one line naming the flag) when it is read, never a traceback from deep in a run."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from shunter.engine.cliargs import (
    byte_count,
    comma_ints,
    non_negative_float,
    positive_float,
    positive_int,
    share,
    times,
)


def test_the_types_take_what_they_name() -> None:
    assert comma_ints("1,32") == (1, 32)
    assert times("16x8") == (16, 8)
    assert share("0.25") == 0.25
    assert non_negative_float("0") == 0.0


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (comma_ints, "1,0"),
        (comma_ints, "a,b"),
        (comma_ints, ""),
        (times, "16"),
        (times, "0x8"),
        (times, "16x-1"),
        (share, "0"),
        (share, "1"),
        (share, "nan"),
        (non_negative_float, "-1"),
        (non_negative_float, "inf"),
        (positive_int, "1.5"),
        (positive_float, "nan"),
        (byte_count, "inf"),
        (byte_count, "nanG"),
    ],
)
def test_the_types_refuse_what_is_out_of_range(parse: Callable[[str], object], text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse(text)


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "scheduler", "--steps", "0"],
        ["bench", "scheduler", "--live", "0,256"],
        ["bench", "remap", "--live", "0"],
        ["bench", "remap", "--steps", "-1"],
        ["bench", "simulator", "--rps", "0"],
        ["bench", "simulator", "--duration", "nan"],
        ["bench", "isolation", "--rate", "0"],
        ["bench", "isolation", "--requests", "0"],
        ["bench", "isolation", "--fanout", "16"],
        ["bench", "isolation", "--duration", "-5"],
        ["bench", "server", "--requests", "0"],
        ["bench", "gateway", "--streams", "0"],
        ["bench", "gateway", "--requests", "0"],
        ["bench", "gateway", "--replicas", "0"],
        ["bench", "gateway", "--duration", "0"],
        ["bench", "gateway", "--kill-at", "2"],
    ],
)
def test_benchmarks_refuse_counts_and_times_out_of_range_as_they_read_them(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from shunter.project.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(args)
    assert e.value.code == 2
    assert f"argument {args[2]}:" in capsys.readouterr().err
