"""``shunter bench remap-exec``: what streaming remapped layers costs a decode step.

One engine, one batch of decoding requests, parameter remapping forced to k lent layers
(``ForcedRemap``): each forward pass then copies k + 1 or k + 2 layers host-to-device
into slots. The figure is the median wall time of a decode step with k layers lent
against the same batch with none, measured in the same run, the settings alternated
``rounds`` times so that a busy machine slows them alike. Host time on this machine:
on the CPU each copy sits in front of its layer; on a GPU it overlaps the layers before.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from shunter.engine.benchmarks.models import model_or_preset
from shunter.engine.config import RemapConfig
from shunter.engine.exec.forced_remap import ForcedRemap
from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.serving import TorchEngine, model_specs
from shunter.engine.exec.sizing import KVNeed, serving_config

PRESET = "small-llama"
MODEL = "m"
SETTLE_STEPS = 8


def bench_remap_exec(
    *,
    model_dir: Path | None = None,
    lent: Sequence[int] = (1, 2, 4),
    num_prompts: int = 8,
    prompt_tokens: int = 32,
    steps: int = 8,
    rounds: int = 3,
    threads: int | None = None,
    device: str = "cpu",
) -> Iterator[str]:
    """Yield the report's lines: per k in ``lent``, the median decode step against k=0."""
    torch.set_num_threads(threads or os.cpu_count() or 1)
    dev = torch.device(device)
    settings = [0, *lent]
    with tempfile.TemporaryDirectory(prefix="shunter-bench-") as tmp:
        model_dir = yield from model_or_preset(tmp, model_dir, PRESET)
        models = {MODEL: model_dir}
        specs = model_specs(models)
        num_layers = specs[0].num_layers
        if max(settings) > num_layers - 2:
            raise ValueError(f"a model of {num_layers} layers lends at most {num_layers - 2}")
        max_tokens = rounds * len(settings) * (steps + SETTLE_STEPS) + 2
        needs = [KVNeed(str(i), MODEL, prompt_tokens + max_tokens) for i in range(num_prompts)]
        # Cap 0: the controller lends exactly the forced layers, and gives back the
        # rest as soon as the forced count drops.
        config = dataclasses.replace(
            serving_config(specs, needs), remap=RemapConfig(enabled=True, cap_fraction=0.0)
        )
        engine = TorchEngine(models, config, device=dev, force_remap=0)
        remapper = engine.core.remapper
        assert remapper is not None and isinstance(remapper.controller, ForcedRemap)
        controller = remapper.controller
        gen = torch.Generator().manual_seed(0)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        for _ in range(num_prompts):
            engine.add_request(
                MODEL, torch.randint(4, 1000, (prompt_tokens,), generator=gen).tolist(), params
            )
        yield (
            f"{model_dir.name} ({num_layers} layers) on {device}, {torch.get_num_threads()} "
            f"threads: a decode step of {num_prompts} requests, {steps} steps x {rounds} rounds "
            "per setting"
        )
        while any(r.num_output_tokens == 0 for r in engine.core.scheduler.requests.values()):
            engine.step()  # prefills
        times: dict[int, list[float]] = {k: [] for k in settings}
        copies: dict[int, int] = dict.fromkeys(settings, 0)
        for _ in range(rounds):
            for k in settings:
                controller.layers = k
                for _ in range(SETTLE_STEPS):
                    if remapper.alpha()[MODEL] == k and not remapper.is_vacating:
                        break
                    engine.step()
                if remapper.alpha()[MODEL] != k:
                    raise RuntimeError(f"remapping did not reach {k} lent layers")
                streamed = engine.executor.num_layers_streamed
                for _ in range(steps):
                    t0 = time.perf_counter()
                    engine.step()
                    times[k].append(time.perf_counter() - t0)
                copies[k] += engine.executor.num_layers_streamed - streamed
        base = statistics.median(times[0])
        yield f"  0 layers lent: {base * 1e3:8.2f} ms a decode step"
        for k in lent:
            t = statistics.median(times[k])
            per_pass = copies[k] / (rounds * steps)
            yield (
                f"  {k} layers lent: {t * 1e3:8.2f} ms a decode step ({per_pass:.0f} layer "
                f"copies a pass), {t / base:.2f}x the step with none"
            )
