"""``shunter bench loadgen`` prints its rate and timing error and writes them as figures."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from shunter.engine.benchfigure import read_figures
from tests.conftest import VENV_BIN

pytestmark = pytest.mark.slow


def test_bench_loadgen_reports_rate_and_timing_error(tmp_path: Path) -> None:
    command = [str(VENV_BIN / "shunter"), "bench", "loadgen", "--rps", "100", "--duration", "2"]
    command += ["--tokens", "16", "--itl-ms", "5", "--json", str(tmp_path / "figures.json")]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    text = run.stdout
    sent = re.search(r"sent ([\d.]+) req/s \(schedule's own rate ([\d.]+), ratio ([\d.]+)\)", text)
    assert sent, text
    assert float(sent.group(3)) > 0.8
    assert "completed 200/200" in text and "failed 0" in text, text
    assert "baseline: the dispatcher alone, same schedule and window, ms: p50" in text
    lag = re.search(r"p50 ([\d.]+)\s+p90 ([\d.]+)\s+p99 ([\d.]+)\s+max ([\d.]+)", text)
    assert lag, text
    p50, p90, p99, top = map(float, lag.groups())
    assert 0 <= p50 <= p90 <= p99 <= top
    assert "(target p99 <= 5)" in text
    # The printed figures, with their targets, as `shunter bench check` reads them.
    figures = {f.name: f for f in read_figures(tmp_path / "figures.json")}
    assert set(figures) == {"loadgen.sent_rps", "loadgen.timing_error_p99_ms"}
    rate, error = figures["loadgen.sent_rps"], figures["loadgen.timing_error_p99_ms"]
    assert (rate.target, rate.direction, f"{rate.value:.1f}") == (100.0, ">=", sent.group(1))
    assert (error.target, error.direction, f"{error.value:.3f}") == (5.0, "<=", f"{p99:.3f}")
