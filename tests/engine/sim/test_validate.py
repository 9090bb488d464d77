import dataclasses
import json
import math
from pathlib import Path

import pytest

from shunter.engine.sim.metrics import RequestRecord
from shunter.engine.sim.runner import SimRun
from shunter.engine.sim.validate import (
    CALIBRATION,
    FIGURES,
    HELD_OUT,
    Check,
    mean_iteration_s,
    run_checks,
)
from shunter.project.cli import main


def test_calibration_figures_come_back_from_the_constants_derived_from_them() -> None:
    # hardware.py derives the efficiencies and host overheads from these figures; the
    # cost model reproduces each within its rounding.
    calibration = [f for f in FIGURES if f.role == CALIBRATION]
    assert len(calibration) >= 5
    for check in run_checks(calibration):
        assert abs(check.error) < 0.01, check.figure.name


def test_every_figure_is_sourced_and_either_calibration_or_held_out() -> None:
    assert {f.role for f in FIGURES} == {CALIBRATION, HELD_OUT}
    assert {f.component for f in FIGURES} == {"step", "copy"}
    assert len({f.name for f in FIGURES}) == len(FIGURES)
    assert all(f.source and f.setting and f.published > 0 for f in FIGURES)


def test_a_lower_bound_is_met_at_or_above_it_and_missed_by_its_shortfall() -> None:
    bound = dataclasses.replace(FIGURES[0], published=40.0, lower_bound=True)
    assert Check(bound, 55.0).error == 0.0
    assert Check(bound, 30.0).error == pytest.approx(-0.25)
    assert Check(dataclasses.replace(bound, lower_bound=False), 50.0).error == pytest.approx(0.25)


def run_with(records: list[RequestRecord]) -> SimRun:
    return SimRun(
        records=records,
        record_models=["m"] * len(records),
        sim_duration_s=10.0,
        wall_s=0.0,
        num_steps=0,
        rotations=0,
        d2h_bytes=0,
        h2d_bytes=0,
        peak_hbm_bytes=0,
        peak_host_bytes=0,
        stall_s=0.0,
    )


def test_mean_iteration_skips_idle_gaps_and_steps_after_the_window() -> None:
    records = [
        # Two requests share steps ending at 1.0, 1.1 and 1.3 (gaps 0.1 and 0.2) ...
        RequestRecord.from_token_times(0.5, [1.0, 1.1, 1.3]),
        RequestRecord.from_token_times(0.9, [1.1, 1.3]),
        # ... then the engine idles until a request arrives at 5.0: 1.3 -> 5.2 is no step.
        RequestRecord.from_token_times(5.0, [5.2, 5.5, 9.0]),
    ]
    assert mean_iteration_s(run_with(records), until=6.0) == pytest.approx((0.1 + 0.2 + 0.3) / 3)
    assert mean_iteration_s(run_with(records), until=10.0) == pytest.approx(
        (0.1 + 0.2 + 0.3 + 3.5) / 4
    )
    with pytest.raises(ValueError):
        mean_iteration_s(run_with(records[:1]), until=1.05)


def test_simulate_validate_prints_a_row_per_figure_and_writes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "validate.json"
    assert main(["simulate", "--validate", "--duration", "3", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("SIMULATED: the cost model against measured and published")
    lines = printed.splitlines()
    rows = [line for line in lines if line.startswith((CALIBRATION, HELD_OUT))]
    assert len(rows) == len(FIGURES)
    assert all(f.name in row for f, row in zip(FIGURES, rows, strict=True))
    assert lines[-2].startswith("SIMULATED: median |error|: calibration ")
    assert "held-out step" in lines[-2] and "held-out copy" in lines[-2]

    doc = json.loads(out.read_text())
    assert doc["simulated"] is True and doc["duration_s"] == 3.0
    figures = doc["figures"]
    assert [f["name"] for f in figures] == [f.name for f in FIGURES]
    for f in figures:
        assert math.isfinite(f["simulated"]) and f["simulated"] >= 0
        assert math.isfinite(f["error"])
    assert doc["summary"][HELD_OUT]["num_figures"] == sum(f.role == HELD_OUT for f in FIGURES)
