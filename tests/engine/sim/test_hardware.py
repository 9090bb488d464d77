import json
from pathlib import Path

import pytest

from shunter.engine.sim.hardware import (
    GB,
    HOST_LAYER_OVERHEAD_S,
    HOST_STEP_OVERHEAD_S,
    PROFILES,
    HardwareProfile,
    KiB,
    MiB,
    get_profile,
    gh200,
    h100,
    h200,
    load_profile,
    profile_json,
)


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=list(PROFILES))
def test_link_bandwidth_is_monotonic_in_copy_size(profile: HardwareProfile) -> None:
    sizes = [2**k for k in range(10, 34)]
    rates = [profile.link_bandwidth(s) for s in sizes]
    assert rates == sorted(rates)
    assert all(r > 0 for r in rates)


def test_gh200_curve_passes_through_the_papers_points() -> None:
    assert gh200.link_bandwidth(64 * KiB) == pytest.approx(10 * GB)
    assert gh200.link_bandwidth(8 * MiB) == pytest.approx(200 * GB)
    assert gh200.link_bandwidth(1024 * MiB) == pytest.approx(200 * GB)
    # A 4 MiB block-first block (Qwen2.5-32B) sits between the two regimes.
    assert 100 * GB < gh200.link_bandwidth(4 * MiB) < 200 * GB
    # Below the smallest point a copy costs a constant time.
    assert gh200.link_bandwidth(16 * KiB) == pytest.approx(2.5 * GB)


def test_public_capacities_and_bandwidths() -> None:
    assert gh200.host_mem_bw == 384 * GB
    assert h200.hbm_bytes == 141 * GB and h200.hbm_bw == 4.8e12
    assert h100.hbm_bytes == 80 * GB and h100.hbm_bw == 3.35e12
    assert h100.link_bandwidth(1 << 30) == pytest.approx(55 * GB)
    assert all(p.sources for p in PROFILES.values())


def test_load_profile_round_trip(tmp_path: Path) -> None:
    raw = {
        "name": "measured",
        "hbm_bytes": 1.4e11,
        "hbm_bw": 4.0e12,
        "peak_flops": 7e14,
        "host_bytes": 4.8e11,
        "copy_curve": [[65536, 9e9], [1048576, 8e10], [8388608, 1.9e11]],
        "host_mem_bw": None,
        "copy_launch_s": 4e-6,
        "step_overhead_s": 5e-4,
    }
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(raw))
    profile = load_profile(path)
    assert profile.host_mem_bw is None
    assert profile.link_bandwidth(1048576) == pytest.approx(8e10)
    # A file without the efficiency keys (written before them, or measured) is used as
    # measured: its GEMM and HBM figures are achieved ones, and no per-layer floor.
    assert (profile.gemm_efficiency, profile.hbm_efficiency) == (1.0, 1.0)
    assert profile.layer_overhead_s == 0.0
    assert (profile.flops, profile.bandwidth) == (7e14, 4.0e12)
    assert get_profile(str(path)) == profile
    assert get_profile("gh200") is gh200


def test_load_profile_rejects_missing_keys_and_bad_curves(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"name": "x"}))
    with pytest.raises(ValueError, match="lacks key"):
        load_profile(path)
    with pytest.raises(ValueError, match="increasing"):
        HardwareProfile(
            name="bad",
            hbm_bytes=1,
            hbm_bw=1,
            peak_flops=1,
            host_bytes=1,
            copy_curve=((8.0, 1.0), (4.0, 2.0)),
            host_mem_bw=None,
            copy_launch_s=0,
            step_overhead_s=0,
        )
    with pytest.raises(ValueError, match="unknown hardware"):
        get_profile("tpu")


def test_efficiencies_are_fractions_and_overheads_not_negative() -> None:
    fields = {
        "name": "x",
        "hbm_bytes": 1,
        "hbm_bw": 1,
        "peak_flops": 1,
        "host_bytes": 1,
        "copy_curve": ((1.0, 1.0),),
        "host_mem_bw": None,
        "copy_launch_s": 0,
        "step_overhead_s": 0,
    }
    HardwareProfile(**fields, gemm_efficiency=1.0, hbm_efficiency=0.5)
    for bad in (0.0, -0.1, 1.01):
        with pytest.raises(ValueError, match="gemm_efficiency"):
            HardwareProfile(**fields, gemm_efficiency=bad)
        with pytest.raises(ValueError, match="hbm_efficiency"):
            HardwareProfile(**fields, hbm_efficiency=bad)
    with pytest.raises(ValueError, match="overheads"):
        HardwareProfile(**fields, layer_overhead_s=-1e-6)


def test_built_in_efficiencies_come_from_the_measured_figures() -> None:
    # H100: the measured GEMM midpoint (743-761 TFLOP/s) and decode attention kernel
    # (2,741-2,744 GB/s); H200 and GH200: the H200's GEMM midpoint (769-798).
    assert h100.flops == pytest.approx(752e12)
    assert h100.bandwidth == pytest.approx(2742.5e9)
    assert h200.flops == gh200.flops == pytest.approx(783.5e12)
    assert h200.bandwidth / h200.hbm_bw == gh200.bandwidth / gh200.hbm_bw
    for p in PROFILES.values():
        assert 0.7 < p.gemm_efficiency < 0.85 and 0.75 < p.hbm_efficiency < 0.9
        assert p.step_overhead_s == HOST_STEP_OVERHEAD_S
        assert p.layer_overhead_s == HOST_LAYER_OVERHEAD_S
        assert any(s.startswith("MEASURED") for s in p.sources)


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=list(PROFILES))
def test_profile_json_round_trips_through_load_profile(
    profile: HardwareProfile, tmp_path: Path
) -> None:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(profile_json(profile)))
    loaded = load_profile(path)
    assert loaded == profile
    assert loaded.sources == profile.sources
    assert loaded.gemm_efficiency == profile.gemm_efficiency < 1


def test_load_profile_ignores_a_calibration_object(tmp_path: Path) -> None:
    raw = {**profile_json(h200), "calibration": {"models": {"m": {"t_decode": 0.01}}}}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(raw))
    assert load_profile(path) == h200
