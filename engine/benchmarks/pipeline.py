"""``shunter bench pipeline``: async scheduling against the sequential step loop, host
wall time on this machine.

A batch of ``batch`` requests decodes through ``TorchEngine`` (greedy, every request to
its length) once with each loop, alternated ``rounds`` times. Per decode step of the
whole batch it takes the interval between two steps' returns (what a caller sees) and
the models' forward passes within it (``StepStats.compute_s``: on a GPU, device time
from CUDA events); it prints

- steps/s, each loop's decode steps over their time (the median of the rounds), and
  their ratio;
- the host's share of the critical path: 1 - forward / interval, the time per step the
  forward pass did not cover (planning, sampling, handing out outputs, waits);
- the same under a CPU hog beside the engine (one busy process per core, BLINK's
  colocated setting), and each loop's throughput with the hog over without it
  (BLINK's colocated / isolated ratio).
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from shunter.engine.benchfigure import BenchFigure, ReportItem
from shunter.engine.benchmarks.models import model_or_preset
from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.serving import TorchEngine, model_specs
from shunter.engine.exec.sizing import KVNeed, serving_config
from shunter.engine.loadgen.engine_process import random_prompts

PRESET = "tiny-llama"
MODEL = "m"
# The targets: pipelined steps/s at least 1.2x sequential at batch 32, and a
# colocated / isolated throughput ratio at least 0.2 higher than the sequential loop's.
SPEEDUP_TARGET = 1.2
HOG_GAIN_TARGET = 0.2


@dataclass(frozen=True)
class _Run:
    """One loop's decode steps: the intervals between their returns and their forward
    passes, seconds."""

    intervals: list[float]
    forwards: list[float]


def bench_pipeline(
    *,
    model_dir: Path | None = None,
    batch: int = 32,
    prompt_tokens: int = 64,
    max_tokens: int = 128,
    rounds: int = 3,
    threads: int | None = 1,
    hog: bool = True,
    device: str = "cpu",
) -> Iterator[ReportItem]:
    """Run the comparison and yield the report's lines and figures."""
    torch.set_num_threads(threads or os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="shunter-bench-") as tmp:
        model_dir = yield from model_or_preset(tmp, model_dir, PRESET)
        prompts = random_prompts(batch, prompt_tokens)
        yield (
            f"{model_dir.name} on {device}, {torch.get_num_threads()} torch threads, "
            f"{os.cpu_count()} cores: {batch} requests x {prompt_tokens} prompt tokens, "
            f"{max_tokens} output tokens each; decode steps of the whole batch, "
            f"{rounds} alternated rounds"
        )
        dev = torch.device(device)
        quiet = _compare(model_dir, prompts, max_tokens, rounds, dev)
        yield from _report("isolated", quiet)
        seq, pipe = (_steps_per_s(runs) for runs in quiet)
        yield BenchFigure("pipeline.steps_ratio", pipe / seq, SPEEDUP_TARGET, ">=", "x")
        if not hog:
            return
        with _cpu_hog(os.cpu_count() or 1):
            busy = _compare(model_dir, prompts, max_tokens, rounds, dev)
        yield from _report(f"beside a CPU hog ({os.cpu_count()} busy processes)", busy)
        seq_hog, pipe_hog = (_steps_per_s(runs) for runs in busy)
        seq_ratio, pipe_ratio = seq_hog / seq, pipe_hog / pipe
        yield "colocated / isolated throughput (BLINK's ratio)"
        yield f"    sequential  {seq_ratio:5.2f}"
        yield f"    pipelined   {pipe_ratio:5.2f}"
        gain = pipe_ratio - seq_ratio
        yield (
            f"    pipelined - sequential  {gain:+.2f}  (target >= +{HOG_GAIN_TARGET})"
            f"  {'met' if gain >= HOG_GAIN_TARGET else 'MISSED'}"
        )
        yield BenchFigure("pipeline.hog_ratio_gain", gain, HOG_GAIN_TARGET, ">=", "")


def _compare(
    model_dir: Path, prompts: list[list[int]], max_tokens: int, rounds: int, device: torch.device
) -> tuple[list[_Run], list[_Run]]:
    """Each loop ``rounds`` times, alternated, after one warm-up run of each."""
    sequential: list[_Run] = []
    pipelined: list[_Run] = []
    for i in range(rounds + 1):
        for runs, async_scheduling in ((sequential, False), (pipelined, True)):
            run = _decode(model_dir, prompts, max_tokens, device, async_scheduling)
            if i:  # the first round warms up
                runs.append(run)
    return sequential, pipelined


def _decode(
    model_dir: Path,
    prompts: list[list[int]],
    max_tokens: int,
    device: torch.device,
    async_scheduling: bool,
) -> _Run:
    models = {MODEL: model_dir}
    needs = [KVNeed(f"#{i}", MODEL, len(p) + max_tokens) for i, p in enumerate(prompts)]
    config = serving_config(model_specs(models), needs, async_scheduling=async_scheduling)
    engine = TorchEngine(models, config, device=device)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for p in prompts:
        engine.add_request(MODEL, p, params)
    intervals, forwards = [], []
    last = None
    while not engine.core.is_idle():
        stats, _ = engine.step_with_stats()
        now = time.perf_counter()
        if last is not None and stats.num_decodes == len(prompts):
            intervals.append(now - last)
            forwards.append(stats.compute_s)
        last = now
    engine.core.close()
    return _Run(intervals, forwards)


def _steps_per_s(runs: list[_Run]) -> float:
    """Throughput: decode steps over their total time, the median of the rounds (not a
    median step: the scheduler's time slices stall a few steps, for milliseconds each,
    and a median of steps would not see them)."""
    return statistics.median(len(run.intervals) / sum(run.intervals) for run in runs)


def _host_share(runs: list[_Run]) -> float:
    """The share of the rounds' decode time that no forward pass covered."""
    interval = sum(x for run in runs for x in run.intervals)
    forward = sum(x for run in runs for x in run.forwards)
    return max(0.0, 1.0 - forward / interval)


def _report(setting: str, runs: tuple[list[_Run], list[_Run]]) -> Iterator[str]:
    sequential, pipelined = runs
    seq, pipe = _steps_per_s(sequential), _steps_per_s(pipelined)
    yield f"{setting}: decode steps/s, host share of the critical path"
    for name, rate, loop in (("sequential", seq, sequential), ("pipelined ", pipe, pipelined)):
        host = _host_share(loop)
        yield f"    {name}  {rate:8.1f} steps/s  {1e3 / rate:7.3f} ms  host {host:4.0%}"
    yield f"    pipelined / sequential  {pipe / seq:.2f}x  (target >= {SPEEDUP_TARGET}x)"


def _spin() -> None:
    while True:
        pass


@contextmanager
def _cpu_hog(processes: int) -> Iterator[None]:
    """``processes`` busy processes for the block's duration."""
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(processes)]
    for h in hogs:
        h.start()
    try:
        yield
    finally:
        for h in hogs:
            h.terminate()
        for h in hogs:
            h.join()
