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

# A step's fixed cost where nothing measured it: no public figure exists for our engine.
ASSUMED_STEP_OVERHEAD_S = 1e-3


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
    roofline does not see (launches, sampling, synchronisation).
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
    sources: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        positive = ("hbm_bytes", "hbm_bw", "peak_flops", "host_bytes")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"HardwareProfile {self.name!r}: {name} must be positive")
        if self.host_mem_bw is not None and self.host_mem_bw <= 0:
            raise ValueError(f"HardwareProfile {self.name!r}: host_mem_bw must be positive")
        if self.copy_launch_s < 0 or self.step_overhead_s < 0:
            raise ValueError(f"HardwareProfile {self.name!r}: overheads must be >= 0")
        if not self.copy_curve:
            raise ValueError(f"HardwareProfile {self.name!r}: copy_curve needs a point")
        sizes = [size for size, _ in self.copy_curve]
        if sizes != sorted(set(sizes)) or any(s <= 0 or bw <= 0 for s, bw in self.copy_curve):
            raise ValueError(
                f"HardwareProfile {self.name!r}: copy_curve needs positive points "
                "with strictly increasing sizes"
            )

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
# - Step overhead: ASSUMED_STEP_OVERHEAD_S (no public figure for our engine); a measured
#   profile (load_profile) replaces it.
_GH200_SOURCES = (
    "NVIDIA GH200 Grace Hopper Superchip datasheet",
    "SuperInfer (MLSys 2026) §3.3, Fig. 5, Table 1, Appendix B",
)
_C2C_CURVE = ((64 * KiB, 10 * GB), (8 * MiB, 200 * GB))

gh200 = HardwareProfile(
    name="gh200",
    hbm_bytes=144 * GB,
    hbm_bw=4.9 * TB,
    peak_flops=989e12,
    host_bytes=480 * GB,
    copy_curve=_C2C_CURVE,
    host_mem_bw=384 * GB,
    copy_launch_s=5e-6,
    step_overhead_s=ASSUMED_STEP_OVERHEAD_S,
    sources=_GH200_SOURCES,
)

# GH200 with 96 GB HBM3 at 4 TB/s (the original variant; NVIDIA GH200 datasheet; the
# "Profiling vLLM on the GH200" study used it). Link and DRAM facts as above.
gh200_96g = HardwareProfile(
    name="gh200-96g",
    hbm_bytes=96 * GB,
    hbm_bw=4.0 * TB,
    peak_flops=989e12,
    host_bytes=480 * GB,
    copy_curve=_C2C_CURVE,
    host_mem_bw=384 * GB,
    copy_launch_s=5e-6,
    step_overhead_s=ASSUMED_STEP_OVERHEAD_S,
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
# Host memory: DGX H200 has 2 TB of system memory for 8 GPUs, 256 GB each.
h200 = HardwareProfile(
    name="h200",
    hbm_bytes=141 * GB,
    hbm_bw=4.8 * TB,
    peak_flops=989e12,
    host_bytes=256 * GB,
    copy_curve=_PCIE5_CURVE,
    host_mem_bw=None,
    copy_launch_s=5e-6,
    step_overhead_s=ASSUMED_STEP_OVERHEAD_S,
    sources=("NVIDIA H200 Tensor Core GPU datasheet", "NVIDIA DGX H200 datasheet", *_PCIE_SOURCES),
)

# H100 SXM: 80 GB HBM3 at 3.35 TB/s, 989 TFLOP/s dense BF16 (NVIDIA H100 datasheet).
# Host memory: DGX H100 has 2 TB of system memory for 8 GPUs, 256 GB each.
h100 = HardwareProfile(
    name="h100",
    hbm_bytes=80 * GB,
    hbm_bw=3.35 * TB,
    peak_flops=989e12,
    host_bytes=256 * GB,
    copy_curve=_PCIE5_CURVE,
    host_mem_bw=None,
    copy_launch_s=5e-6,
    step_overhead_s=ASSUMED_STEP_OVERHEAD_S,
    sources=("NVIDIA H100 Tensor Core GPU datasheet", "NVIDIA DGX H100 datasheet", *_PCIE_SOURCES),
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
          "sources": ["how and when it was measured"],  # optional
          "calibration": {...}             # optional, ignored here
        }

    ``shunter engine calibrate`` writes this schema (``profile_json``) and adds a
    ``calibration`` object with what it measured beyond it: each direction's and the
    duplex copy curve, and per-model layer timings for the remapping controller
    (``engine/exec/calibrate.py``). Keys this function does not know are ignored.
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
        "sources": list(profile.sources),
    }
