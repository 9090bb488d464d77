"""``shunter engine calibrate``: measure this machine and write a hardware profile.

The profile is ``load_profile``'s JSON (``engine/sim/hardware.py``), so
``shunter simulate --hardware FILE`` runs on it, plus a ``calibration`` object with what
that schema has no field for. How each figure is obtained:

- ``copy_curve``: for each copy size, the slower of the two directions alone (the cost
  model applies one curve to both); both directions are kept in ``calibration.copies``.
- ``host_mem_bw``: what both directions moved together, per second, at the largest
  size: the limit the cost model puts on full-duplex copies.
- ``copy_launch_s``: the host cost of issuing one copy call.
- ``hbm_bw`` and ``peak_flops``: a large device-to-device copy and a dense GEMM.
- ``hbm_bytes``: the device's memory (on CPU, this machine's RAM); ``host_bytes``: RAM.
- ``step_overhead_s``: a measured decode step (batch, pass, sampling) less the cost
  model's roofline of the same step on this profile, at each model's smallest decode
  shape, median over models; without ``--model`` the built-in profiles' assumption.
- ``calibration.models``: per model, one decoder layer's time and the whole pass by
  decode batch and context and by prefill chunk and context, and the priors the
  remapping controller starts from (``remap.timing.LayerTiming``, read back by
  ``calibrate_json.timing_priors``): ``t_transfer`` one layer's host-to-device copy,
  ``t_decode`` and ``t_prefill`` the shortest measured pass of each kind. Short passes
  are the cautious prior (fewer layers fit under them), as with ``measure_timing``'s.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from shunter.engine.calibrate.device import (
    CopyBench,
    device_bandwidth,
    matmul_flops,
)
from shunter.engine.calibrate.layers import ModelTimings, Shape, measure_model
from shunter.engine.calibrate.profile import (
    COPY_HEADER,
    copies_json,
    copy_line,
    dtype_name,
    model_json,
    model_lines,
)
from shunter.engine.config import ModelSpec
from shunter.engine.exec.hf_config import model_spec_from_config, read_config
from shunter.engine.sim.cost import SeqWork, StepCostModel
from shunter.engine.sim.hardware import (
    ASSUMED_STEP_OVERHEAD_S,
    GB,
    HardwareProfile,
    KiB,
    MiB,
    profile_json,
)

Say = Callable[[str], None]


class CalibrationError(Exception):
    """Input ``shunter engine calibrate`` cannot run with; the message is for the user."""


@dataclass(frozen=True)
class Plan:
    """What one calibration measures: copy sizes (cycling through ``copy_span_bytes``),
    the device copy and GEMM sizes, the model shapes, and timed runs per figure."""

    copy_sizes: tuple[int, ...]
    copy_span_bytes: int
    device_copy_bytes: int
    gemm_n: int
    gemm_dtype: torch.dtype
    shapes: tuple[Shape, ...]
    repeats: int
    block_tokens: int = 16


def _grid(batches: Sequence[int], tokens: Sequence[int], contexts: Sequence[int]) -> list[Shape]:
    """Shapes smallest first: batch, then new tokens, then context."""
    return [
        Shape("decode" if t == 1 else "prefill", b, t, c)
        for b in batches
        for t in tokens
        for c in contexts
    ]


def plan_for(device: torch.device, *, quick: bool) -> Plan:
    """The default plan: ``quick`` takes seconds on a CPU with a tiny model; the full one
    covers copies up to 256 MiB and serving shapes (decode batch 1 to 256 at 1k and 4k of
    context, prefill chunks of 512 and 2048 tokens)."""
    cuda = device.type == "cuda"
    if quick:
        return Plan(
            copy_sizes=tuple(64 * KiB * 4**k for k in range(5)),  # 64 KiB .. 16 MiB
            copy_span_bytes=64 * MiB,
            device_copy_bytes=(256 if cuda else 64) * MiB,
            gemm_n=4096 if cuda else 512,
            gemm_dtype=torch.bfloat16 if cuda else torch.float32,
            shapes=(*_grid((1, 4), (1,), (16, 64)), *_grid((1,), (16, 64), (0, 64))),
            repeats=2,
        )
    return Plan(
        copy_sizes=tuple(64 * KiB * 4**k for k in range(7)),  # 64 KiB .. 256 MiB
        copy_span_bytes=256 * MiB,
        device_copy_bytes=(1024 if cuda else 256) * MiB,
        gemm_n=8192 if cuda else 2048,
        gemm_dtype=torch.bfloat16 if cuda else torch.float32,
        shapes=(
            *_grid((1, 16, 64, 256), (1,), (1024, 4096)),
            *_grid((1,), (512, 2048), (0, 4096)),
        ),
        repeats=5,
    )


@dataclass(frozen=True)
class ModelDir:
    """A model directory to calibrate, named after the directory."""

    name: str
    path: Path
    spec: ModelSpec


def model_dirs(paths: Sequence[str | Path]) -> list[ModelDir]:
    """Check ``--model`` directories: each a supported config with weights, names distinct."""
    found: dict[str, ModelDir] = {}
    for text in paths:
        path = Path(text)
        if not (path / "config.json").is_file():
            raise CalibrationError(f"--model {text}: not a model directory (no config.json)")
        try:
            spec = model_spec_from_config(read_config(path), path.resolve().name)
        except KeyError as e:
            raise CalibrationError(f"--model {text}: config.json lacks {e}") from None
        except (ValueError, TypeError) as e:
            raise CalibrationError(f"--model {text}: unsupported config: {e}") from None
        weights = ("model.safetensors", "model.safetensors.index.json")
        if not any((path / name).is_file() for name in weights):
            raise CalibrationError(f"--model {text}: no {' or '.join(weights)}")
        if spec.name in found:
            raise CalibrationError(f"--model {text}: a second model named {spec.name!r}")
        found[spec.name] = ModelDir(spec.name, path, spec)
    return list(found.values())


def check_out(out: Path) -> None:
    """``--out`` must be a new or existing ``.json`` file in an existing directory."""
    if out.suffix != ".json":
        raise CalibrationError(f"--out {out}: must end in .json (how --hardware finds a file)")
    if out.is_dir():
        raise CalibrationError(f"--out {out}: is a directory")
    if not out.parent.is_dir():
        raise CalibrationError(f"--out {out}: directory {out.parent} does not exist")


def run_calibrate(
    *, device_name: str | None, models: Sequence[str | Path], out: Path, quick: bool, say: Say
) -> dict[str, Any]:
    """Check the arguments, calibrate, write the profile to ``out`` and return it."""
    from shunter.engine.errors import ServeError
    from shunter.engine.generate.run import available_device

    check_out(out)
    dirs = model_dirs(models)
    try:
        device = available_device(device_name)
    except ServeError as e:
        raise CalibrationError(str(e)) from None
    profile = calibrate(device=device, models=dirs, quick=quick, say=say)
    out.write_text(json.dumps(profile, indent=2) + "\n")
    say(f"wrote {out} (MEASURED): shunter simulate --hardware {out}")
    return profile


def calibrate(
    *, device: torch.device, models: Sequence[ModelDir], quick: bool, say: Say
) -> dict[str, Any]:
    """Measure ``device`` and ``models`` and return the profile JSON (module docstring)."""
    plan = plan_for(device, quick=quick)
    cuda = device.type == "cuda"
    label = _device_label(device)
    say(f"calibrating {label}{' (quick)' if quick else ''}: every figure MEASURED here")
    bench = CopyBench(device, max(plan.copy_sizes), span_bytes=plan.copy_span_bytes)
    launch_s = bench.launch_s(repeats=plan.repeats)
    say(f"copy launch: {launch_s * 1e6:.2f} us per call")
    say(COPY_HEADER)
    copies = []
    for size in plan.copy_sizes:
        copies.append(bench.point(size, repeats=plan.repeats))
        say(copy_line(copies[-1]))
    del bench
    hbm_bw = device_bandwidth(device, plan.device_copy_bytes, repeats=plan.repeats)
    peak_flops = matmul_flops(device, plan.gemm_n, plan.gemm_dtype, repeats=plan.repeats)
    say(
        f"device memory: {hbm_bw / GB:.1f} GB/s; dense GEMM ({dtype_name(plan.gemm_dtype)}, "
        f"n={plan.gemm_n}): {peak_flops / 1e12:.3f} TFLOP/s"
    )
    ram = _ram_bytes()
    hbm_bytes = torch.cuda.get_device_properties(device).total_memory if cuda else ram
    profile = HardwareProfile(
        name="calibrated-" + re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-"),
        hbm_bytes=float(hbm_bytes),
        hbm_bw=hbm_bw,
        peak_flops=peak_flops,
        host_bytes=float(ram),
        copy_curve=tuple((float(p.size), min(p.h2d, p.d2h)) for p in copies),
        host_mem_bw=copies[-1].duplex,
        copy_launch_s=launch_s,
        step_overhead_s=0.0,
    )
    timings = {}
    for m in models:
        timings[m.name] = measure_model(
            m.path,
            m.spec,
            plan.shapes,
            device=device,
            block_tokens=plan.block_tokens,
            kv_budget_bytes=_kv_budget(device),
            repeats=plan.repeats,
        )
        for line in model_lines(timings[m.name]):
            say(line)
        _require_both_kinds(timings[m.name])
        if cuda:
            torch.cuda.empty_cache()  # the next model's KV budget sees this one's memory free
    overhead, how = _step_overhead(profile, timings.values())
    say(f"step overhead: {overhead * 1e3:.3f} ms ({how})")
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    profile = dataclasses.replace(
        profile,
        step_overhead_s=overhead,
        sources=(
            f"shunter engine calibrate{' --quick' if quick else ''} on {platform.node()}, "
            f"{label}, torch {torch.__version__}, {stamp}",
            "copy_curve: the slower direction per size; host_mem_bw: both directions at "
            "once at the largest size; calibration.copies has each",
            f"step_overhead_s: {how}",
        ),
    )
    models_json = {}
    for name, t in timings.items():
        bench = CopyBench(device, t.spec.layer_bytes)
        t_transfer = bench.seconds("h2d", t.spec.layer_bytes, repeats=plan.repeats)
        del bench
        models_json[name] = model_json(t, t_transfer)
    calibration = {
        "device": str(device),
        "device_name": label,
        "quick": quick,
        "copy_launch_s": launch_s,
        "copies": copies_json(copies),
        "gemm": {"n": plan.gemm_n, "dtype": dtype_name(plan.gemm_dtype)},
        "device_copy_bytes": plan.device_copy_bytes,
        "models": models_json,
    }
    return {**profile_json(profile), "calibration": calibration}


def _require_both_kinds(t: ModelTimings) -> None:
    """The controller's priors need a decode and a prefill pass of every model."""
    for kind in ("decode", "prefill"):
        if not any(p.shape.kind == kind for p in t.points):
            reasons = "; ".join(sorted({why for s, why in t.skipped if s.kind == kind}))
            raise CalibrationError(f"model {t.spec.name}: no {kind} shape could run ({reasons})")


def _step_overhead(profile: HardwareProfile, timings: Iterable[ModelTimings]) -> tuple[float, str]:
    gaps = []
    for t in timings:
        decode = [p for p in t.points if p.shape.kind == "decode"]
        if not decode:
            continue
        s = decode[0].shape  # the grid lists the smallest first
        roofline = StepCostModel(t.spec, profile).forward_time(
            [SeqWork(s.tokens, s.context)] * s.batch, s.batch
        )
        gaps.append(max(0.0, decode[0].t_step_s - roofline))
    if not gaps:
        return ASSUMED_STEP_OVERHEAD_S, "assumed, as in the built-in profiles (no --model)"
    return statistics.median(gaps), (
        "a measured decode step less its roofline, smallest decode shape, median over models"
    )


def _kv_budget(device: torch.device) -> int:
    """KV bytes one shape may allocate: half the free device memory, or a quarter of
    the RAM available on a CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 2
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        available = _ram_bytes() // 2
    return int(available // 4)


def _ram_bytes() -> int:
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {platform.machine()}".strip()
