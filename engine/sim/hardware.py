"""Hardware profiles: the public facts the simulator's cost model needs about one GPU node.

All quantities are SI: bytes, bytes per second, FLOP per second, seconds
(1 GB = 1e9 bytes, as datasheets count).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GB = 1e9
TB = 1e12
KiB = 1024
MiB = 1024 * 1024

DATASHEET_BF16_DENSE_FLOPS = 989e12  # H100/H200/GH200 Tensor Cores, dense BF16

# --- Achievable efficiency and host overhead -------------------------------------------
# The constants below derive from these CALIBRATION figures only; every other figure that
# ``shunter simulate --validate`` lists is held out (engine/sim/validate.py).
#
# MEASURED 2026-11-25, H100 80GB HBM3, make gpu-check (docs/engine.md), torch 2.11:
_H100_GEMM_FLOPS = (743e12 + 761e12) / 2  # bf16 8192^3 GEMM, 743-761 TFLOP/s
_H100_COPY_BW = (2903e9 + 3005e9) / 2  # device-to-device copy, read + written bytes
# Triton paged-attention decode, batch 256 at a 1k context, one llama-3-8b layer (bf16):
# 2,741-2,744 GB/s, the memory-bound operator the cost model times most.
_H100_DECODE_ATTENTION_BW = (2741e9 + 2744e9) / 2
# MEASURED 2026-11-04, one NVIDIA H200 (141 GB HBM3e), torch 2.11: bf16 8192^3 GEMM
# 769-798 TFLOP/s; device-to-device copy about 4.3 TB/s (read + written bytes).
_H200_GEMM_FLOPS = (769e12 + 798e12) / 2
_H200_COPY_BW = 4.3e12

# GEMM fraction of peak FLOP/s (MFU-like): the measured GEMM over the datasheet's 989.
H100_GEMM_EFFICIENCY = _H100_GEMM_FLOPS / DATASHEET_BF16_DENSE_FLOPS  # 0.760
H200_GEMM_EFFICIENCY = _H200_GEMM_FLOPS / DATASHEET_BF16_DENSE_FLOPS  # 0.792
# HBM fraction for memory-bound operators (MBU-like): the decode attention kernel over
# the H100 datasheet's 3.35 TB/s. The H200 ran only the copy: its copy fraction (4.3 of
# 4.8 TB/s) times the H100's kernel-to-copy ratio (2,742.5 / 2,954 = 0.928).
H100_HBM_EFFICIENCY = _H100_DECODE_ATTENTION_BW / 3.35e12  # 0.819
H200_HBM_EFFICIENCY = _H200_COPY_BW / 4.8e12 * _H100_DECODE_ATTENTION_BW / _H100_COPY_BW  # 0.832

# Host overhead of an engine step, solved from this project's torch executor (eager, no
# CUDA graphs) on that H100 (x86 host), in the form the cost model uses (cost.py): a step
# takes HOST_STEP_OVERHEAD_S plus, per layer, the longer of the layer's roofline time and
# HOST_LAYER_OVERHEAD_S (kernels are issued asynchronously, so the host's per-layer issue
# time and the device's work overlap), plus the output head. Two measured steps:
# - a decode step of 64 requests (~160-token contexts) over 4 of llama-3-8b's 32 layers
#   (bf16): 6.09 and 7.56 ms in two runs, mean 6.825 ms; its roofline on the H100 profile
#   is 0.175 ms a layer and 0.383 ms for the head;
# - small-llama (fp32, 12 layers, 768 wide): 8.7 ms a decode step whatever the batch
#   (launch-bound: a roofline of 0.012 ms a layer and 0.009 ms for the head), from
#   ``engine calibrate``'s first run (step overhead 8.70 ms; decode steps 8.8-10.0 ms at
#   batch 1-64). The same machine measured 13.7-23.1 ms in a second calibrate run and
#   21.1 ms in bench remap-exec at batch 8: with 13.7 ms, b would be ~0.9 ms and a
#   ~2.8 ms. The small model's steps are that noisy; these constants carry that doubt.
# a + 4 b = 6.825 - 0.383 and a + 12 b = 8.7 - 0.009 give b = 0.281 ms (above the 0.175 ms
# roofline, as assumed) and a = 5.32 ms; rounded to 0.28 and 5.3 ms. Each run alone gives
# b 0.19-0.37 ms and a 4.2-6.4 ms: the two measurements are that far apart.
HOST_STEP_OVERHEAD_S = 5.3e-3
HOST_LAYER_OVERHEAD_S = 0.28e-3
# What a profile without a measured step assumes (``shunter engine calibrate`` without
# ``--model``): the built-in profiles' per-step figure.
ASSUMED_STEP_OVERHEAD_S = HOST_STEP_OVERHEAD_S


@dataclass(frozen=True)
class HardwareProfile:
    """One GPU and its host link, as the cost model sees them.

    ``copy_curve`` gives the sustained bandwidth of *one direction* of the host link for
    copies of a given size, as ``(segment_bytes, bytes_per_s)`` points sorted by size;
    between points bandwidth is interpolated in log-log space, beyond the last point it is
    flat, and below the first point a copy takes as long as one of the first point's size
    (small copies are latency-bound). ``host_mem_bw`` is the host memory bandwidth that
    both directions share (Grace DRAM on GH200), or None where the link, not host memory,
    is the limit. ``copy_launch_s`` is the host-side cost of issuing one copy call;
    ``step_overhead_s`` is the fixed cost of one engine step that the cost model's
    roofline does not see (batch building, sampling, synchronisation), and
    ``layer_overhead_s`` the least time one decoder layer takes (the host issuing its
    kernels), whatever the roofline says.

    ``peak_flops`` and ``hbm_bw`` are what the cost model scales: a GEMM reaches
    ``gemm_efficiency`` of ``peak_flops`` and a memory-bound operator ``hbm_efficiency``
    of ``hbm_bw`` (``flops`` and ``bandwidth``). The built-in profiles give datasheet
    peaks and measured fractions; a measured profile gives achieved figures and 1.0.
    """

    name: str
    hbm_bytes: float
    hbm_bw: float
    peak_flops: float
    host_bytes: float
    copy_curve: tuple[tuple[float, float], ...]
    host_mem_bw: float | None
    copy_launch_s: float
    step_overhead_s: float
    gemm_efficiency: float = 1.0
    hbm_efficiency: float = 1.0
    layer_overhead_s: float = 0.0
    sources: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        positive = ("hbm_bytes", "hbm_bw", "peak_flops", "host_bytes")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"HardwareProfile {self.name!r}: {name} must be positive")
        if self.host_mem_bw is not None and self.host_mem_bw <= 0:
            raise ValueError(f"HardwareProfile {self.name!r}: host_mem_bw must be positive")
        if min(self.copy_launch_s, self.step_overhead_s, self.layer_overhead_s) < 0:
            raise ValueError(f"HardwareProfile {self.name!r}: overheads must be >= 0")
        for name in ("gemm_efficiency", "hbm_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"HardwareProfile {self.name!r}: {name} must be in (0, 1]")
        if not self.copy_curve:
            raise ValueError(f"HardwareProfile {self.name!r}: copy_curve needs a point")
        sizes = [size for size, _ in self.copy_curve]
        if sizes != sorted(set(sizes)) or any(s <= 0 or bw <= 0 for s, bw in self.copy_curve):
            raise ValueError(
                f"HardwareProfile {self.name!r}: copy_curve needs positive points "
                "with strictly increasing sizes"
            )

    @property
    def flops(self) -> float:
        """FLOP/s a GEMM achieves: ``gemm_efficiency`` of ``peak_flops``."""
        return self.peak_flops * self.gemm_efficiency

    @property
    def bandwidth(self) -> float:
        """Bytes/s a memory-bound operator achieves: ``hbm_efficiency`` of ``hbm_bw``."""
        return self.hbm_bw * self.hbm_efficiency

    def link_bandwidth(self, segment_bytes: float) -> float:
        """Sustained one-direction bandwidth (bytes/s) for copies of ``segment_bytes``."""
        curve = self.copy_curve
        first_size, first_bw = curve[0]
        if segment_bytes <= first_size:
            # Latency-bound: a smaller copy costs as long as the smallest measured one.
            return first_bw * segment_bytes / first_size
        for (s0, b0), (s1, b1) in itertools.pairwise(curve):
            if segment_bytes < s1:
                frac = math.log(segment_bytes / s0) / math.log(s1 / s0)
                return b0 * math.pow(b1 / b0, frac)
        return curve[-1][1]


# GH200 Grace Hopper, 144 GB HBM3e variant: the SuperInfer paper's testbed (GH200 NVL2).
# - HBM 144 GB at 4.9 TB/s; H100 Tensor Cores 989 TFLOP/s dense BF16 (1,979 with
#   sparsity): NVIDIA GH200 Grace Hopper Superchip datasheet.
# - Grace LPDDR5X 480 GB; 384 GB/s per NUMA node, and Grace DRAM is half-duplex, so
#   concurrent D2H and H2D copies share ~384 GB/s (~192 GB/s each): SuperInfer §3.3,
#   Table 1 ("Ideal (duplex)"), citing the NVIDIA Grace Hopper architecture whitepaper.
# - NVLink-C2C: 450 GB/s per direction in theory; measured full duplex it saturates at
#   ~200 GB/s per direction for copies >= 8 MB and falls below 10 GB/s for copies
#   <= 64 KB: SuperInfer §3.3, Fig. 5 and §4.3.1 (nvbandwidth v0.8, Appendix B).
# - Per-copy launch: a cudaMemcpyAsync call costs a few microseconds on the host,
#   comparable to a 64 KB segment's transfer time (SuperInfer Fig. 12); 5 us assumed.
# - Efficiency: nothing was measured on a GH200. Its GPU is the GH100 die of the H100 and
#   H200; the 144 GB variant has the H200's HBM3e and a power limit at least as high, so
#   it takes the H200's GEMM and HBM fractions (the 96 GB HBM3 variant the H100's HBM
#   fraction).
# - Host overhead: the x86 H100 host's figures. Grace's cores issue kernels more slowly
#   ("Profiling vLLM on the GH200": CUDA graphs cut its median decode time per token by
#   over 40% at low load), so on GH200 these are likely low.
# A measured profile (load_profile) replaces all of these.
_MEASURED_SOURCES = (
    "MEASURED 2026-11-25, H100 80GB HBM3, make gpu-check (docs/engine.md): GEMM, decode "
    "attention, copy and executor steps (efficiency and host overhead)",
    "MEASURED 2026-11-04, one NVIDIA H200: bf16 GEMM 769-798 TFLOP/s, copy ~4.3 TB/s",
)
_GH200_SOURCES = (
    "NVIDIA GH200 Grace Hopper Superchip datasheet",
    "SuperInfer (MLSys 2026) §3.3, Fig. 5, Table 1, Appendix B",
    *_MEASURED_SOURCES,
)
_C2C_CURVE = ((64 * KiB, 10 * GB), (8 * MiB, 200 * GB))

gh200 = HardwareProfile(
    name="gh200",
    hbm_bytes=144 * GB,
    hbm_bw=4.9 * TB,
    peak_flops=DATASHEET_BF16_DENSE_FLOPS,
    host_bytes=480 * GB,
    copy_curve=_C2C_CURVE,
    host_mem_bw=384 * GB,
    copy_launch_s=5e-6,
    step_overhead_s=HOST_STEP_OVERHEAD_S,
    gemm_efficiency=H200_GEMM_EFFICIENCY,
    hbm_efficiency=H200_HBM_EFFICIENCY,
    layer_overhead_s=HOST_LAYER_OVERHEAD_S,
    sources=_GH200_SOURCES,
)

# GH200 with 96 GB HBM3 at 4 TB/s (the original variant; NVIDIA GH200 datasheet; the
# "Profiling vLLM on the GH200" study used it). Link and DRAM facts as above.
gh200_96g = HardwareProfile(
    name="gh200-96g",
    hbm_bytes=96 * GB,
    hbm_bw=4.0 * TB,
    peak_flops=DATASHEET_BF16_DENSE_FLOPS,
    host_bytes=480 * GB,
    copy_curve=_C2C_CURVE,
    host_mem_bw=384 * GB,
    copy_launch_s=5e-6,
    step_overhead_s=HOST_STEP_OVERHEAD_S,
    gemm_efficiency=H200_GEMM_EFFICIENCY,
    hbm_efficiency=H100_HBM_EFFICIENCY,
    layer_overhead_s=HOST_LAYER_OVERHEAD_S,
    sources=_GH200_SOURCES,
)

# PCIe Gen5 x16 hosts: 64 GB/s per direction in theory, ~55 GB/s sustained for large
# copies (SuperInfer §3.2 and Fig. 5, H200 curve). Small copies are bound by per-copy DMA
# setup rather than by the link, so the 64 KB point is taken equal to the C2C one
# (an assumption: the paper gives no PCIe figure for small copies). The x86 host's DRAM
# (8 channels DDR5-4800 per socket, ~307 GB/s) is faster than both PCIe directions
# together, so the link alone limits: host_mem_bw is None.
_PCIE5_CURVE = ((64 * KiB, 10 * GB), (8 * MiB, 55 * GB))
_PCIE_SOURCES = ("SuperInfer (MLSys 2026) §3.2, Fig. 5", "PCI-SIG PCIe 5.0 specification")

# H200 SXM: 141 GB HBM3e at 4.8 TB/s, 989 TFLOP/s dense BF16 (NVIDIA H200 datasheet).
# Host memory: DGX H200 has 2 TB of system memory for 8 GPUs, 256 GB each. Efficiency:
# the H200's measured fractions; host overhead: the H100's (an x86 host like DGX H200's).
h200 = HardwareProfile(
    name="h200",
    hbm_bytes=141 * GB,
    hbm_bw=4.8 * TB,
    peak_flops=DATASHEET_BF16_DENSE_FLOPS,
    host_bytes=256 * GB,
    copy_curve=_PCIE5_CURVE,
    host_mem_bw=None,
    copy_launch_s=5e-6,
    step_overhead_s=HOST_STEP_OVERHEAD_S,
    gemm_efficiency=H200_GEMM_EFFICIENCY,
    hbm_efficiency=H200_HBM_EFFICIENCY,
    layer_overhead_s=HOST_LAYER_OVERHEAD_S,
    sources=(
        "NVIDIA H200 Tensor Core GPU datasheet",
        "NVIDIA DGX H200 datasheet",
        *_PCIE_SOURCES,
        *_MEASURED_SOURCES,
    ),
)

# H100 SXM: 80 GB HBM3 at 3.35 TB/s, 989 TFLOP/s dense BF16 (NVIDIA H100 datasheet).
# Host memory: DGX H100 has 2 TB of system memory for 8 GPUs, 256 GB each. Efficiency
# and host overhead: the H100's measured figures.
h100 = HardwareProfile(
    name="h100",
    hbm_bytes=80 * GB,
    hbm_bw=3.35 * TB,
    peak_flops=DATASHEET_BF16_DENSE_FLOPS,
    host_bytes=256 * GB,
    copy_curve=_PCIE5_CURVE,
    host_mem_bw=None,
    copy_launch_s=5e-6,
    step_overhead_s=HOST_STEP_OVERHEAD_S,
    gemm_efficiency=H100_GEMM_EFFICIENCY,
    hbm_efficiency=H100_HBM_EFFICIENCY,
    layer_overhead_s=HOST_LAYER_OVERHEAD_S,
    sources=(
        "NVIDIA H100 Tensor Core GPU datasheet",
        "NVIDIA DGX H100 datasheet",
        *_PCIE_SOURCES,
        _MEASURED_SOURCES[0],
    ),
)

PROFILES: dict[str, HardwareProfile] = {p.name: p for p in (gh200, gh200_96g, h200, h100)}


def get_profile(name_or_path: str) -> HardwareProfile:
    """A built-in profile by name, or a measured one from a JSON file path."""
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    path = Path(name_or_path)
    if path.suffix == ".json" and path.exists():
        return load_profile(path)
    raise ValueError(
        f"unknown hardware {name_or_path!r}: choose one of {sorted(PROFILES)} "
        "or give a profile JSON file"
    )


def load_profile(path: str | Path) -> HardwareProfile:
    """Read a measured profile from JSON.

    Schema (SI units; every key required unless marked optional)::

        {
          "name": "gh200-measured",
          "hbm_bytes": 1.44e11,            # device memory
          "hbm_bw": 4.0e12,                # achieved HBM bandwidth, bytes/s
          "peak_flops": 7.0e14,            # achieved dense BF16 GEMM throughput
          "host_bytes": 4.8e11,            # host memory usable for KV swap
          "copy_curve": [[65536, 9.0e9], [8388608, 1.9e11]],
                                           # [segment bytes, one-direction bytes/s]
          "host_mem_bw": 3.84e11,          # shared by both directions; null if none
          "copy_launch_s": 5e-6,
          "step_overhead_s": 1e-3,
          "gemm_efficiency": 1.0,          # optional (1.0): peak_flops is achieved
          "hbm_efficiency": 1.0,           # optional (1.0): hbm_bw is achieved
          "layer_overhead_s": 0.0,         # optional (0.0): least time of a layer
          "sources": ["how and when it was measured"],  # optional
          "calibration": {...}             # optional, ignored here
        }

    ``shunter engine calibrate`` writes this schema (``profile_json``) and adds a
    ``calibration`` object with what it measured beyond it: each direction's and the
    duplex copy curve, and per-model layer timings for the remapping controller
    (``engine/calibrate/run.py``). Keys this function does not know are ignored. A
    measured profile's ``peak_flops`` and ``hbm_bw`` are achieved figures, so without
    the optional keys the cost model uses them as they are.
    """
    raw: dict[str, Any] = json.loads(Path(path).read_text())
    try:
        return HardwareProfile(
            name=str(raw["name"]),
            hbm_bytes=float(raw["hbm_bytes"]),
            hbm_bw=float(raw["hbm_bw"]),
            peak_flops=float(raw["peak_flops"]),
            host_bytes=float(raw["host_bytes"]),
            copy_curve=tuple((float(s), float(bw)) for s, bw in raw["copy_curve"]),
            host_mem_bw=None if raw["host_mem_bw"] is None else float(raw["host_mem_bw"]),
            copy_launch_s=float(raw["copy_launch_s"]),
            step_overhead_s=float(raw["step_overhead_s"]),
            gemm_efficiency=float(raw.get("gemm_efficiency", 1.0)),
            hbm_efficiency=float(raw.get("hbm_efficiency", 1.0)),
            layer_overhead_s=float(raw.get("layer_overhead_s", 0.0)),
            sources=tuple(str(s) for s in raw.get("sources", ())),
        )
    except KeyError as exc:
        raise ValueError(f"{path}: hardware profile lacks key {exc.args[0]!r}") from None


def profile_json(profile: HardwareProfile) -> dict[str, Any]:
    """``profile`` in ``load_profile``'s schema: ``load_profile`` of it gives it back."""
    return {
        "name": profile.name,
        "hbm_bytes": profile.hbm_bytes,
        "hbm_bw": profile.hbm_bw,
        "peak_flops": profile.peak_flops,
        "host_bytes": profile.host_bytes,
        "copy_curve": [[size, bw] for size, bw in profile.copy_curve],
        "host_mem_bw": profile.host_mem_bw,
        "copy_launch_s": profile.copy_launch_s,
        "step_overhead_s": profile.step_overhead_s,
        "gemm_efficiency": profile.gemm_efficiency,
        "hbm_efficiency": profile.hbm_efficiency,
        "layer_overhead_s": profile.layer_overhead_s,
        "sources": list(profile.sources),
    }
