"""The scheduler benchmark runs the real step loop and reports what it timed."""

from __future__ import annotations

from shunter.engine.bench import bench_policy, bench_remap, bench_scheduler
from shunter.engine.benchfigure import split_report


def test_bench_policy_times_planning_under_contention() -> None:
    result = bench_policy("lvf", 64, steps=5, warmup=5)
    assert result.policy == "lvf" and result.num_live == 64 and result.steps == 5
    assert 0.0 < result.median_s < 1.0


def test_bench_policy_lvf_rotates_when_memory_is_contended() -> None:
    # 700 live requests outgrow the arena's ~15k blocks: LVF swaps blocks in every step.
    result = bench_policy("lvf", 700, steps=3, warmup=30)
    assert result.h2d_blocks_per_step > 0


def test_bench_scheduler_prints_one_row_per_size_with_the_ratio() -> None:
    lines = bench_scheduler((16,), steps=3)
    assert lines[0].split() == ["live", "lvf", "ms", "fcfs", "ms", "lvf/fcfs", "lvf", "h2d/step"]
    live, lvf_ms, fcfs_ms, ratio, h2d = lines[1].split()
    assert live == "16" and h2d == "0"
    assert abs(float(lvf_ms) / float(fcfs_ms) - float(ratio)) < 0.05 * float(ratio) + 0.01


def test_bench_remap_lends_layers_with_eight_tenants() -> None:
    lines, figures = split_report(bench_remap(400, steps=3, warmup=10))
    assert lines[0].split()[:3] == ["models", "live", "running"]
    for line in lines[1:3]:
        models, live, _, median_ms, _, _ = line.split()
        assert (models, live) == ("8", "400") and 0.0 < float(median_ms) < 1000.0
    assert [line.split()[2] for line in lines[1:3]] == ["256", "400"]
    assert int(lines[2].split()[4]) > 0  # 400 requests outgrow 14 GB of KV: layers lent
    assert lines[3] == "(target <= 1.5 ms)"
    # Each row's median is a figure held to the printed target.
    assert [(f.name, f.target, f.direction, f.unit) for f in figures] == [
        ("remap.planning_ms.default_cap", 1.5, "<=", "ms"),
        ("remap.planning_ms.all_running", 1.5, "<=", "ms"),
    ]
    assert [f"{f.value:.3f}" for f in figures] == [line.split()[3] for line in lines[1:3]]
