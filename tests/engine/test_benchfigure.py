"""Benchmark figures: validated, and read back as they were written."""

from __future__ import annotations

from pathlib import Path

import pytest

from shunter.engine.benchfigure import BenchFigure, read_figures, split_report, write_figures


def test_a_figure_needs_a_direction_and_a_positive_target() -> None:
    with pytest.raises(ValueError, match="direction"):
        BenchFigure("f", 1.0, 1.0, "<", "ms")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        BenchFigure("f", 1.0, 0.0, "<=", "ms")


def test_the_bound_widens_the_target_by_the_margin_in_the_figures_direction() -> None:
    assert BenchFigure("f", 0.0, 2.0, "<=", "ms").bound(0.25) == 2.5
    assert BenchFigure("f", 0.0, 20.0, ">=", "x").bound(0.25) == 15.0


def test_figures_are_read_back_as_written(tmp_path: Path) -> None:
    figures = [BenchFigure("a", 1.25, 1.5, "<=", "ms"), BenchFigure("b", 30.0, 20.0, ">=", "x")]
    write_figures(tmp_path / "f.json", figures)
    assert read_figures(tmp_path / "f.json") == figures
    (tmp_path / "bad.json").write_text('{"lines": []}')
    with pytest.raises(ValueError, match="not a figures file"):
        read_figures(tmp_path / "bad.json")


def test_a_report_splits_into_its_lines_and_its_figures() -> None:
    figure = BenchFigure("a", 1.0, 1.5, "<=", "ms")
    assert split_report(["x", figure, "y"]) == (["x", "y"], [figure])
