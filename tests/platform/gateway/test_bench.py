"""``shunter bench gateway`` runs end to end on a tiny workload and prints its ratios."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import REPO, VENV_BIN

pytestmark = pytest.mark.slow


def test_bench_gateway_reports_both_paths_and_ratios(clean_env: dict[str, str]) -> None:
    command = [str(VENV_BIN / "shunter"), "bench", "gateway", "--streams", "2"]
    command += ["--requests", "2", "--prompt-tokens", "8", "--max-tokens", "4", "--rounds", "1"]
    run = subprocess.run(
        command, cwd=REPO, env=clean_env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    rows = [line.split() for line in lines[2:5]]
    assert [r[0] for r in rows] == ["engine", "gateway", "ratio"]
    assert all(float(v) > 0 for r in rows[:2] for v in r[1:])
    assert rows[2][1].endswith("x") and rows[2][2].endswith("x")
    assert lines[5].startswith("gateway/engine: TTFT ratio ")
    assert "added median ITL" in lines[5]
