"""The console's attainment lines: an empty bucket breaks the line."""

from __future__ import annotations

from shunter.console.figures import attainment_figure, with_gaps


def test_an_empty_bucket_breaks_the_line() -> None:
    points = {"60": 1.0, "120": 0.5, "300": 0.75, "360": None}
    times, values = with_gaps(points, 60)
    assert times == [60, 120, 180, 300, 360]
    assert values == [1.0, 0.5, None, 0.75, None]
    assert with_gaps({}, 5) == ([], [])


def test_the_figure_carries_its_bucket_length_for_live_points() -> None:
    fig = attainment_figure("t", {"7": {"0": 1.0, "10": 1.0}}, {"7": "acme"}, (0, 20), 5)
    (trace,) = fig["data"]
    assert trace["x"] == [0, 5000, 10000] and trace["y"] == [1.0, None, 1.0]
    assert trace["name"] == "acme" and trace["connectgaps"] is False
    assert fig["layout"]["meta"] == {"step_s": 5}
