"""``shunter bench isolation`` runs its three phases, and the victim/aggressor comparison
on a real engine, end to end on a tiny workload."""

from __future__ import annotations

import pytest

from shunter.engine.benchfigure import split_report
from shunter.engine.server.bench_isolation import bench_isolation
from shunter.engine.server.bench_isolation_variants import bench_isolation_variants
from shunter.engine.sim.isolation import HEADER


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


@pytest.mark.slow
def test_bench_isolation_variants_compares_the_victim_beside_the_aggressor_with_alone() -> None:
    lines, figures = split_report(
        # Seed 4: 3 victim requests within 0.09 s, beside 5 of the aggressor's.
        bench_isolation_variants(variants=("oneiros",), rate=10.0, requests=3, seed=4)
    )
    assert lines[1] == HEADER
    row = lines[2].split()
    assert row[0] == "oneiros"
    assert [(f.name, f.target, f.direction) for f in figures] == [
        ("isolation.engine.oneiros.ttft_p99_ratio", 1.5, "<="),
        ("isolation.engine.oneiros.attainment", 95.0, ">="),
    ]
    ratio, attainment = figures
    assert row[3] == f"{ratio.value:.2f}x"
    assert row[4] == ("ok" if ratio.value <= 1.5 else "MISSED")
    assert row[9] == f"{attainment.value:.1f}%"
    assert lines[3].startswith("preemptions over both phases: oneiros ")
