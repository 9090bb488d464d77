"""``shunter bench pipeline`` runs end to end (a tiny batch, for speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from shunter.engine.benchfigure import BenchFigure
from shunter.engine.benchmarks.pipeline import _cpu_hog, bench_pipeline
from shunter.project.cli import main


def test_the_bench_compares_both_loops_alone_and_beside_a_hog(
    tiny_dirs: dict[str, Path],
) -> None:
    threads = torch.get_num_threads()
    items = list(
        bench_pipeline(
            model_dir=tiny_dirs["tiny-llama"], batch=4, prompt_tokens=5, max_tokens=6, rounds=1
        )
    )
    torch.set_num_threads(threads)
    text = "\n".join(i for i in items if isinstance(i, str))
    assert "isolated: decode steps/s" in text
    assert "beside a CPU hog" in text
    assert "pipelined / sequential" in text and "BLINK's ratio" in text
    figures = {f.name: f for f in items if isinstance(f, BenchFigure)}
    assert set(figures) == {"pipeline.steps_ratio", "pipeline.hog_ratio_gain"}
    assert figures["pipeline.steps_ratio"].value > 0


def test_the_hog_takes_the_cores_and_stops(tmp_path: Path) -> None:
    import multiprocessing

    with _cpu_hog(2):
        assert len(multiprocessing.active_children()) >= 2
    assert not multiprocessing.active_children()


def test_the_bench_is_a_bench_subcommand_that_writes_its_figures(
    tiny_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pipeline.json"
    threads = torch.get_num_threads()
    args = ["bench", "pipeline", "--model", str(tiny_dirs["tiny-llama"]), "--batch", "2"]
    args += ["--max-tokens", "4", "--prompt-tokens", "3", "--rounds", "1", "--no-hog"]
    assert main([*args, "--json", str(out)]) == 0
    torch.set_num_threads(threads)
    assert "beside a CPU hog" not in capsys.readouterr().out
    names = [f["name"] for f in json.loads(out.read_text())["figures"]]
    assert names == ["pipeline.steps_ratio"]
