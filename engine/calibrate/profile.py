"""What ``shunter engine calibrate`` writes under a profile's ``calibration`` object and
prints, and ``timing_priors``, which reads the remapping controller's priors back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from shunter.engine.calibrate.device import CopyPoint
from shunter.engine.calibrate.layers import LayerPoint, ModelTimings, Shape
from shunter.engine.remap.timing import LayerTiming
from shunter.engine.sim.hardware import GB, KiB, MiB


def timing_priors(profile: Mapping[str, Any]) -> dict[str, LayerTiming]:
    """The remapping controller's priors per model from a calibrated profile's JSON."""
    models = profile.get("calibration", {}).get("models", {})
    return {
        name: LayerTiming(float(m["t_transfer"]), float(m["t_decode"]), float(m["t_prefill"]))
        for name, m in models.items()
    }


def copies_json(copies: Sequence[CopyPoint]) -> list[dict[str, Any]]:
    return [
        {
            "bytes": p.size,
            "h2d_bytes_per_s": p.h2d,
            "d2h_bytes_per_s": p.d2h,
            "duplex_bytes_per_s": p.duplex,
        }
        for p in copies
    ]


def model_json(t: ModelTimings, t_transfer: float) -> dict[str, Any]:
    """One model's entry; ``t`` must hold a decode and a prefill point. The priors are
    the shortest pass of each kind (the cautious one: fewer layers fit under it)."""
    decode = [p for p in t.points if p.shape.kind == "decode"]
    prefill = [p for p in t.points if p.shape.kind == "prefill"]
    return {
        "dir": str(t.model_dir),
        "dtype": dtype_name(t.dtype),
        "num_layers": t.spec.num_layers,
        "layer_bytes": t.spec.layer_bytes,
        "block_tokens": t.block_tokens,
        "t_transfer": t_transfer,
        "t_decode": min(p.t_forward_s for p in decode),
        "t_prefill": min(p.t_forward_s for p in prefill),
        "decode": [_point_json(p) for p in decode],
        "prefill": [_point_json(p) for p in prefill],
        "skipped": [{**_shape_json(s), "reason": why} for s, why in t.skipped],
    }


def _shape_json(s: Shape) -> dict[str, Any]:
    return {"kind": s.kind, "batch": s.batch, "tokens": s.tokens, "context": s.context}


def _point_json(p: LayerPoint) -> dict[str, Any]:
    return {
        **_shape_json(p.shape),
        "t_layer_s": p.t_layer_s,
        "t_forward_s": p.t_forward_s,
        "t_step_s": p.t_step_s,
    }


COPY_HEADER = f"{'copy size':>10} {'H2D GB/s':>9} {'D2H GB/s':>9} {'duplex GB/s':>12}"


def copy_line(p: CopyPoint) -> str:
    """One row under ``COPY_HEADER``."""
    return f"{size_text(p.size):>10} {p.h2d / GB:9.2f} {p.d2h / GB:9.2f} {p.duplex / GB:12.2f}"


def model_lines(t: ModelTimings) -> list[str]:
    """A model's measured shapes, one per line, then the skipped ones with why."""
    spec = t.spec
    lines = [
        f"model {spec.name} ({dtype_name(t.dtype)}, {spec.num_layers} layers of "
        f"{size_text(spec.layer_bytes)}):"
    ]
    for p in t.points:
        lines.append(
            f"{_shape_text(p.shape)}: layer {p.t_layer_s * 1e3:8.3f} ms, "
            f"pass {p.t_forward_s * 1e3:8.3f} ms, step {p.t_step_s * 1e3:8.3f} ms"
        )
    lines.extend(f"{_shape_text(s)}: skipped, {why}" for s, why in t.skipped)
    return lines


def _shape_text(s: Shape) -> str:
    return f"  {s.kind:<7} batch {s.batch:>3} tokens {s.tokens:>5} context {s.context:>5}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def size_text(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes} B"
