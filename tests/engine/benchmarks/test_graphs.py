"""``shunter bench graphs`` runs end to end (tiny batches, for speed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shunter.engine.benchmarks.graphs import bench_graphs
from shunter.project.cli import main


def test_the_bench_times_both_passes_for_each_batch(tiny_dirs: dict[str, Path]) -> None:
    threads = torch.get_num_threads()
    lines = list(
        bench_graphs(
            model_dir=tiny_dirs["tiny-llama"], batches=(1, 3), context=9, steps=2, rounds=1
        )
    )
    torch.set_num_threads(threads)
    assert "static pass eager (no CUDA graphs here)" in lines[0]
    rows = [line.split() for line in lines if line.split()[0].isdigit()]
    assert [row[0] for row in rows] == ["1", "3"]
    for row in rows:
        eager_ms, static_ms, ratio = map(float, row[1:4])
        assert eager_ms > 0 and static_ms > 0
        assert ratio == pytest.approx(eager_ms / static_ms, rel=0.01, abs=0.01)


def test_the_command_line_takes_batches(
    tiny_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(tiny_dirs["tiny-llama"])
    args = ["bench", "graphs", "--model", model, "--batches", "2", "--context", "5"]
    assert main([*args, "--steps", "1", "--rounds", "1", "--threads", "1"]) == 0
    assert "eager/static" in capsys.readouterr().out
