"""``shunter bench kernels``: without a GPU it says so and measures nothing; its
benchmark body runs (here through the interpreter, with a wall-clock timer)."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable

import pytest
import torch

from shunter.kernels.bench import CacheShape, Workload, bench_kernels
from tests.conftest import VENV_BIN
from tests.kernels.triton_cases import DEVICE, needs_triton


def wall_clock(fn: Callable[[], object]) -> float:
    fn()  # the first call compiles or interprets once
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@needs_triton
def test_reports_every_kernel_against_its_reference() -> None:
    shape = CacheShape(
        num_heads=4, num_kv_heads=2, head_dim=16, num_layers=2, block_tokens=8, dtype=torch.float32
    )
    work = Workload(
        decode_batches=(1, 3),
        context=20,
        long_context=40,
        prefills=((17, 0), (5, 9)),
        write_tokens=3,
        swap_blocks=2,
        peak_copy_bytes=1 << 16,
    )
    lines = list(bench_kernels(shape=shape, work=work, device=DEVICE, timer=wall_clock))
    assert lines[0].startswith("device ") and "copy peak" in lines[0]
    names = [line.split(":")[0].split()[0] for line in lines[1:]]
    assert names == ["decode"] * 3 + ["prefill"] * 2 + ["write_kv", "gather", "scatter"]
    for line in lines[1:]:
        assert re.search(r"triton [\d.]+ ms .* reference [\d.]+ ms .*: triton [\d.]+x$", line)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cli_without_a_gpu_measures_nothing_and_succeeds() -> None:
    result = subprocess.run(
        [str(VENV_BIN / "shunter"), "bench", "kernels"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "bench kernels: no CUDA device here; nothing measured"
