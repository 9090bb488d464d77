"""``shunter bench isolation`` runs its three phases end to end on a tiny workload."""

from __future__ import annotations

import pytest

from shunter.engine.benchfigure import split_report
from shunter.engine.server.bench_isolation import bench_isolation


@pytest.mark.slow
def test_bench_isolation_reports_each_phase_against_alone_and_the_refused_fanout() -> None:
    lines, figures = split_report(
        bench_isolation(rate=20.0, requests=4, quiet_tokens=2, fanout=(2, 2))
    )
    rows = lines[2:5]
    assert [row.split("  ")[0].strip() for row in rows] == [
        "alone",
        "long prompt (2047 tokens)",
        "max fan-out (2 x n=2)",
    ]
    assert rows[0].split()[3] == "1.00x"
    for row in rows[1:]:
        cells = row.rsplit(")", 1)[1].split()
        assert cells[2].endswith("x") and cells[3] in ("ok", "MISSED") and int(cells[4]) >= 0
    assert lines[5].startswith("3000 x n=8 request: HTTP 400")
    # The two noisy phases' ratios are the figures, held to the printed 1.5x.
    assert [(f.name, f.target, f.direction) for f in figures] == [
        ("isolation.quiet_p99_ratio.long_prompt", 1.5, "<="),
        ("isolation.quiet_p99_ratio.max_fanout", 1.5, "<="),
    ]
    for row, figure in zip(rows[1:], figures, strict=True):
        ratio, verdict = row.rsplit(")", 1)[1].split()[2:4]
        assert ratio == f"{figure.value:.2f}x"
        assert verdict == ("ok" if figure.value <= 1.5 else "MISSED")
