"""``shunter engine calibrate`` measures this machine and writes a profile the simulator
runs on. Figures are timings of a shared machine: tests assert what holds whatever the
noise (positive, finite, how the profile is derived from the measurements, orderings
that hold run by run), never a speed."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from shunter.engine.calibrate.layers import Shape, measure_model
from shunter.engine.calibrate.profile import timing_priors
from shunter.engine.catalog import CATALOG
from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.engine.exec.hf_config import model_spec_from_config, read_config
from shunter.engine.sim.hardware import ASSUMED_STEP_OVERHEAD_S, get_profile, load_profile
from shunter.project.cli import build_parser, main

CUDA = torch.cuda.is_available()


def calibrate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["engine", "calibrate", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def quick_profile(
    tiny_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    """One quick CPU calibration with tiny-llama, shared by the tests that read it."""
    out = tmp_path_factory.mktemp("calibrate") / "cpu.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(
            [
                "engine",
                "calibrate",
                "--device",
                "cpu",
                "--quick",
                "--model",
                str(tiny_dirs["tiny-llama"]),
                "--out",
                str(out),
            ]
        )
    assert code == 0
    return out, stdout.getvalue()


def test_quick_cpu_run_says_what_it_measured(quick_profile: tuple[Path, str]) -> None:
    out, text = quick_profile
    assert "MEASURED" in text
    assert "H2D GB/s" in text and "D2H GB/s" in text and "duplex GB/s" in text
    assert "model tiny-llama" in text
    assert f"wrote {out}" in text


def test_quick_profile_loads_with_positive_figures(quick_profile: tuple[Path, str]) -> None:
    out, _ = quick_profile
    profile = get_profile(str(out))
    assert profile == load_profile(out)
    assert profile.name.startswith("calibrated-")
    for value in (profile.hbm_bytes, profile.hbm_bw, profile.peak_flops, profile.host_bytes):
        assert math.isfinite(value) and value > 0
    assert profile.host_mem_bw is not None and profile.host_mem_bw > 0
    assert profile.copy_launch_s > 0 and profile.step_overhead_s >= 0
    assert any("shunter engine calibrate --quick" in s for s in profile.sources)


def test_copy_curve_is_the_slower_direction_of_each_measured_size(
    quick_profile: tuple[Path, str],
) -> None:
    out, _ = quick_profile
    raw = json.loads(out.read_text())
    copies = raw["calibration"]["copies"]
    sizes = [c["bytes"] for c in copies]
    assert sizes == sorted(set(sizes)) and sizes[0] == 64 * 1024 and sizes[-1] == 16 << 20
    for c in copies:
        for key in ("h2d_bytes_per_s", "d2h_bytes_per_s", "duplex_bytes_per_s"):
            assert math.isfinite(c[key]) and c[key] > 0
    assert raw["copy_curve"] == [
        [c["bytes"], min(c["h2d_bytes_per_s"], c["d2h_bytes_per_s"])] for c in copies
    ]
    assert raw["host_mem_bw"] == copies[-1]["duplex_bytes_per_s"]


def test_layer_timings_nest_and_give_the_controller_priors(
    quick_profile: tuple[Path, str], tiny_dirs: dict[str, Path]
) -> None:
    out, _ = quick_profile
    raw = json.loads(out.read_text())
    model = raw["calibration"]["models"]["tiny-llama"]
    spec = model_spec_from_config(read_config(tiny_dirs["tiny-llama"]), "tiny-llama")
    assert model["num_layers"] == spec.num_layers and model["layer_bytes"] == spec.layer_bytes
    decode, prefill = model["decode"], model["prefill"]
    assert {(p["batch"], p["context"]) for p in decode} == {(1, 16), (1, 64), (4, 16), (4, 64)}
    assert {(p["tokens"], p["context"]) for p in prefill} == {(16, 0), (16, 64), (64, 0), (64, 64)}
    assert all(p["tokens"] == 1 for p in decode) and all(p["batch"] == 1 for p in prefill)
    for p in decode + prefill:
        # Every layer runs inside the pass, and the pass inside the step, run by run.
        assert 0 < spec.num_layers * p["t_layer_s"] <= p["t_forward_s"] <= p["t_step_s"]
    priors = timing_priors(raw)
    assert set(priors) == {"tiny-llama"}
    timing = priors["tiny-llama"]
    assert timing.t_transfer > 0
    assert timing.t_decode == min(p["t_forward_s"] for p in decode)
    assert timing.t_prefill == min(p["t_forward_s"] for p in prefill)


def smallest_catalog_model() -> str:
    return min(CATALOG.values(), key=lambda m: m.param_bytes).name


def test_the_simulator_runs_on_the_calibrated_profile(
    quick_profile: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = quick_profile
    model = CATALOG[smallest_catalog_model()]
    if model.param_bytes > 0.8 * load_profile(out).hbm_bytes:
        pytest.skip(f"{model.name}'s weights do not fit this machine's memory")
    capsys.readouterr()
    args = ["simulate", "--hardware", str(out), "--duration", "5", "--model", model.name]
    assert main([*args, "--policy", "lvf", "--rps", "1"]) == 0
    text = capsys.readouterr().out
    assert f"SIMULATED: {model.name} on {out}" in text
    assert "lvf" in text


def test_measure_model_skips_shapes_it_cannot_hold(tiny_dirs: dict[str, Path]) -> None:
    path = tiny_dirs["tiny-llama"]
    spec = model_spec_from_config(read_config(path), "tiny-llama")
    small = Shape("decode", 1, 1, 15)  # one 16-token block
    large = Shape("decode", 2, 1, 15)  # two
    too_long = Shape("prefill", 1, 16, spec.max_context)
    timings = measure_model(
        path,
        spec,
        [small, large, too_long],
        device=torch.device("cpu"),
        block_tokens=16,
        kv_budget_bytes=spec.block_bytes(16),
        repeats=1,
    )
    assert [p.shape for p in timings.points] == [small]
    reasons = dict(timings.skipped)
    assert set(reasons) == {large, too_long}
    assert "budget" in reasons[large] and "positions" in reasons[too_long]


def test_without_models_the_step_overhead_is_the_stated_assumption(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "link.json"
    code, text, _ = calibrate(capsys, "--device", "cpu", "--quick", "--out", str(out))
    assert code == 0 and "model " not in text
    raw = json.loads(out.read_text())
    assert raw["calibration"]["models"] == {}
    assert load_profile(out).step_overhead_s == ASSUMED_STEP_OVERHEAD_S
    assert "step_overhead_s: assumed, as in the built-in profiles (no --model)" in raw["sources"]


def test_a_model_with_no_runnable_decode_shape_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {**preset_config("tiny-llama"), "max_position_embeddings": 8}
    short = init_model_dir(tmp_path / "short", config=config)
    code, _, err = calibrate(
        capsys, "--device", "cpu", "--quick", "--model", str(short),
        "--out", str(tmp_path / "p.json"),
    )  # fmt: skip
    assert code == 2
    assert "model short: no decode shape could run (longer than the model's 8 positions)" in err
    assert not (tmp_path / "p.json").exists()


def test_engine_alone_still_serves_and_calibrate_is_its_subcommand() -> None:
    parser = build_parser()
    serve = parser.parse_args(["engine", "--model", "a=/models/a"])
    assert serve.func.__name__ == "cmd_engine" and serve.engine_command is None
    calibrate_ns = parser.parse_args(["engine", "calibrate", "--model", "/models/a", "--quick"])
    assert calibrate_ns.func.__name__ == "cmd_calibrate"
    assert calibrate_ns.model == ["/models/a"] and calibrate_ns.quick


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "{tmp}/profile.txt"], "must end in .json"),
        (["--out", "{tmp}/missing/profile.json"], "does not exist"),
        (["--out", "{tmp}"], "must end in .json"),
        (["--out", "{tmp}/dir.json"], "is a directory"),
        (["--model", "{tmp}/nowhere"], "not a model directory (no config.json)"),
        (["--model", "{tmp}/bad"], "unsupported config: unsupported model_type 'gpt2'"),
        (["--model", "{tmp}/partial"], "config.json lacks 'num_attention_heads'"),
        (["--model", "{tmp}/unweighted"], "no model.safetensors or model.safetensors.index.json"),
        (["--model", "{tiny}", "--model", "{tiny}"], "a second model named 'tiny-llama'"),
    ],
)
def test_bad_arguments_are_clear_errors_before_measuring(
    args: list[str],
    message: str,
    tmp_path: Path,
    tiny_dirs: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "unweighted").mkdir()
    config = (tiny_dirs["tiny-llama"] / "config.json").read_text()
    (tmp_path / "unweighted" / "config.json").write_text(config)
    fill: dict[str, Any] = {"tmp": tmp_path, "tiny": tiny_dirs["tiny-llama"]}
    argv = [a.format(**fill) for a in args]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "p.json")]
    code, out, err = calibrate(capsys, "--device", "cpu", *argv)
    assert code == 2
    assert err.startswith("shunter engine calibrate: ") and message in err
    assert "Traceback" not in err and "calibrating" not in out


def test_unknown_device_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["engine", "calibrate", "--device", "tpu"])
    assert exc.value.code == 2
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


@pytest.mark.skipif(CUDA, reason="this machine has a CUDA device")
def test_cuda_without_a_device_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = calibrate(capsys, "--device", "cuda", "--out", str(tmp_path / "p.json"))
    assert code == 2
    assert "no CUDA device is available" in err
    assert not (tmp_path / "p.json").exists()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_quick_cuda_run_measures_the_link(
    tmp_path: Path, tiny_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cuda.json"
    code, text, _ = calibrate(
        capsys, "--device", "cuda", "--quick", "--model", str(tiny_dirs["tiny-llama"]),
        "--out", str(out),
    )  # fmt: skip
    assert code == 0 and "MEASURED" in text
    raw = json.loads(out.read_text())
    assert raw["calibration"]["device"].startswith("cuda")
    copies = raw["calibration"]["copies"]
    # 64 KiB copies are latency-bound on every host link; 16 MiB ones are not.
    for key in ("h2d_bytes_per_s", "d2h_bytes_per_s"):
        assert copies[-1][key] > copies[0][key]
    assert 0 < raw["copy_launch_s"] < 1e-3
    assert timing_priors(raw)["tiny-llama"].t_transfer > 0
    assert load_profile(out).hbm_bytes == torch.cuda.get_device_properties(0).total_memory
