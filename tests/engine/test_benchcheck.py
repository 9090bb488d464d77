"""``shunter bench check`` holds each figure to its target within its noise margin."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from shunter.engine.benchcheck import (
    BENCHES,
    MET,
    MISSED,
    MISSING,
    NO_MARGIN,
    WITHIN,
    Bench,
    format_table,
    judge,
    run_check,
    select,
    simulator_figures,
)
from shunter.engine.benchfigure import BenchFigure, write_figures
from shunter.project.cli import main
from tests.conftest import REPO


def at_most(value: float, target: float = 1.5, name: str = "f") -> BenchFigure:
    return BenchFigure(name, value, target, "<=", "ms")


def at_least(value: float, target: float = 20.0, name: str = "f") -> BenchFigure:
    return BenchFigure(name, value, target, ">=", "x")


def status(figure: BenchFigure, margin: float = 0.25) -> str:
    [verdict] = judge({"f": margin}, [figure])
    return verdict.status


def test_an_at_most_figure_within_its_margin_passes_and_beyond_it_fails() -> None:
    assert status(at_most(1.5)) == MET
    assert status(at_most(1.8)) == WITHIN  # 1.5 x 1.25 = 1.875
    assert status(at_most(1.9)) == MISSED
    assert status(at_most(1.9), margin=0.3) == WITHIN


def test_an_at_least_figure_is_judged_the_other_way() -> None:
    assert status(at_least(25.0)) == MET
    assert status(at_least(16.0)) == WITHIN  # 20 x 0.75 = 15
    assert status(at_least(14.0)) == MISSED
    # The same value on the other side of the target: past an at-most target by far.
    assert status(BenchFigure("f", 26.0, 20.0, "<=", "x")) == MISSED


def test_a_value_that_is_not_a_number_misses() -> None:
    assert status(at_most(float("nan"))) == MISSED


def test_a_missing_figure_fails_and_one_without_a_stated_margin_fails() -> None:
    verdicts = judge({"a": 0.1, "b": 0.1}, [at_most(1.0, name="b"), at_most(1.0, name="c")])
    assert [(v.name, v.status, v.passed) for v in verdicts] == [
        ("a", MISSING, False),
        ("b", MET, True),
        ("c", NO_MARGIN, False),
    ]


def test_the_table_shows_value_target_margin_and_verdict() -> None:
    lines = format_table(judge({"remap.x": 0.25, "gone": 0.1}, [at_most(1.8, name="remap.x")]))
    assert lines[0].split() == ["figure", "value", "target", "margin", "verdict"]
    assert lines[1].split() == [
        "remap.x",
        "1.8",
        "ms",
        "<=",
        "1.5",
        "ms",
        "25%",
        "within",
        "margin",
    ]
    assert lines[2].split() == ["gone", "-", "-", "10%", "MISSING"]


def test_the_simulators_figure_is_read_from_its_all_line() -> None:
    lines = ["  lvf    120.0 simulated s in   2.00 wall s:    60.0 sim-s/wall-s (10 steps)\n"]
    lines.append("  all      37.5 sim-s/wall-s (target >= 20)\n")
    [figure] = simulator_figures(lines)
    assert (figure.name, figure.value, figure.target, figure.direction) == (
        "simulator.sim_s_per_wall_s",
        37.5,
        20.0,
        ">=",
    )
    assert simulator_figures(lines[:1]) == []


def test_the_simulators_scenario_figure_is_read_from_its_scenario_line() -> None:
    lines = [
        "  all      37.5 sim-s/wall-s (target >= 20)\n",
        "  scenario c2 spatial combined, 4 req/s per model for 30 s: 215.1 simulated s in "
        "4.11 wall s: 52.3 sim-s/wall-s (10136 steps; target >= 20)\n",
    ]
    figures = simulator_figures(lines)
    assert [(f.name, f.value, f.target) for f in figures] == [
        ("simulator.sim_s_per_wall_s", 37.5, 20.0),
        ("simulator.scenario_sim_s_per_wall_s", 52.3, 20.0),
    ]


def test_the_benchmarks_are_those_of_make_bench() -> None:
    script = (REPO / "scripts" / "bench.sh").read_text()
    commands = [c.strip() for c in re.findall(r'/bin/shunter" bench ([^\n]+)', script)]
    assert [b.label for b in BENCHES] == commands
    assert all(0 < m < 1 for b in BENCHES for m in b.margins.values())


Command = Callable[[Bench, Path | None], list[str]]


def fake_bench(report: str, figures: list[BenchFigure], exit_status: int = 0) -> Command:
    """A command standing in for ``shunter bench NAME``: prints ``report``, writes
    ``figures`` where --json says, exits with ``exit_status``."""

    def command(bench: Bench, json_path: Path | None) -> list[str]:
        if json_path is not None:
            write_figures(json_path, figures)
        code = f"print({report!r}); raise SystemExit({exit_status})"
        return [sys.executable, "-c", code]

    return command


def test_check_passes_when_every_figure_passes_and_prints_the_reports(
    capsys: pytest.CaptureFixture[str],
) -> None:
    benches = [Bench("quiet"), Bench("timed", {"f": 0.25})]
    command = fake_bench("a report line", [at_most(1.8)])
    assert run_check(benches, command) == 0
    out = capsys.readouterr().out
    assert out.count("a report line") == 2
    assert "== quiet" in out and "ran to the end, no target: quiet" in out
    assert "1 of 1 passed" in out


def test_check_fails_on_a_figure_past_its_margin_or_a_failed_benchmark(
    capsys: pytest.CaptureFixture[str],
) -> None:
    benches = [Bench("timed", {"f": 0.25})]
    assert run_check(benches, fake_bench("r", [at_most(1.9)])) == 1
    assert "0 of 1 passed; failed: f" in capsys.readouterr().out
    failing = fake_bench("r", [at_most(1.0)], exit_status=3)
    assert run_check([Bench("quiet"), *benches], failing) == 1
    out = capsys.readouterr().out
    assert "FAILED (exit status 3)" in out and "failed: quiet (run), timed (run)" in out


def test_a_name_selects_every_command_of_that_name_once() -> None:
    chosen = select(["isolation", "remap"])
    assert [b.name for b in chosen] == ["remap", "isolation", "isolation", "isolation"]
    assert len({b.label for b in chosen}) == 4  # the CPU phases and two simulated runs
    assert select([b.name for b in BENCHES]) == list(BENCHES)
    with pytest.raises(ValueError, match="among scheduler, remap"):
        select(["nope"])


def test_bench_check_help_and_a_wrong_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "check", "--help"])
    assert exit_.value.code == 0
    assert "noise margin" in capsys.readouterr().out
    assert main(["bench", "check", "--only", "remap,nope"]) == 2
    assert "--only takes names among scheduler, remap" in capsys.readouterr().err
