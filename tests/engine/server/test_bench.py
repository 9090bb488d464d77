"""``shunter bench server`` runs end to end on a tiny workload."""

from __future__ import annotations

from pathlib import Path

from shunter.engine.server.bench import bench_server


def test_bench_server_reports_both_paths_and_ratios(model_dirs: dict[str, Path]) -> None:
    lines = list(
        bench_server(
            model_dir=model_dirs["tiny-llama"],
            streams=(1, 2),
            requests=2,
            prompt_tokens=8,
            max_tokens=4,
            threads=1,
            rounds=1,
        )
    )
    rows = [line.split() for line in lines[2:]]
    assert [(r[0], r[1]) for r in rows] == [
        ("1", "in-process"), ("1", "server"), ("1", "ratio"),
        ("2", "in-process"), ("2", "server"), ("2", "ratio"),
    ]  # fmt: skip
    assert all(r[2].endswith("x") for r in rows if r[1] == "ratio")
