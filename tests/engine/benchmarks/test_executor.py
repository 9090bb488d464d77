"""``shunter bench executor`` runs end to end (on a tiny model, for speed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shunter.engine.benchmarks.executor import bench_executor
from shunter.project.cli import main


def test_executor_bench_reports_both_ratios(tiny_dirs: dict[str, Path]) -> None:
    threads = torch.get_num_threads()
    lines = list(
        bench_executor(
            model_dir=tiny_dirs["tiny-llama"],
            num_prompts=3,
            prompt_tokens=5,
            max_tokens=4,
            swap_blocks=2,
            threads=1,
        )
    )
    torch.set_num_threads(threads)
    text = "\n".join(lines)
    assert "ratio engine/transformers" in text
    assert "identical outputs: 3 of 3 requests" in text
    assert "ratio with/without" in text
    assert "B = 2 blocks" in text


def test_the_bench_is_a_bench_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "executor", "--help"])
    assert "--swap-blocks" in capsys.readouterr().out
