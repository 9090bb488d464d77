import json
from pathlib import Path

import pytest

from shunter.engine.sim.hardware import get_profile, profile_json
from shunter.platform.cli import main


def test_simulate_prints_a_simulated_table_and_writes_json_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json, out_html = tmp_path / "out.json", tmp_path / "out.html"
    argv = [
        "simulate", "--model", "llama-3-8b", "--hardware", "h100", "--policy", "lvf,fcfs",
        "--rps", "1,2", "--duration", "5", "--ttft-slo", "5", "--tbt-slo", "0.1",
        "--seed", "3", "--json", str(out_json), "--plot", str(out_html),
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("SIMULATED: llama-3-8b on h100")
    assert all("SIMULATED" in line for line in printed.splitlines() if "written" in line)
    assert len([line for line in printed.splitlines() if line.startswith(("lvf", "fcfs"))]) == 4

    doc = json.loads(out_json.read_text())
    assert doc["simulated"] is True
    assert doc["config"]["model"] == "llama-3-8b" and doc["config"]["seed"] == 3
    assert doc["config"]["hardware_profile"]["sources"]
    results = doc["results"]
    assert [(r["policy"], r["rps"]) for r in results] == [
        ("lvf", 1.0), ("lvf", 2.0), ("fcfs", 1.0), ("fcfs", 2.0),
    ]  # fmt: skip
    for key in ("ttft_attainment", "tbt_attainment", "slo_attainment", "goodput",
                "p99_ttft_s", "p99_tpot_s", "throughput_tok_s", "rotations"):  # fmt: skip
        assert key in results[0]
    assert results[0]["slo_attainment"] == 1.0

    html = out_html.read_text()
    assert "<html>" in html and "SIMULATED" in html
    # Self-contained: plotly.js is inlined, not fetched.
    assert len(html) > 1_000_000 and "<script src=" not in html


def test_simulate_rejects_bad_rates_and_unknown_models(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--rps", "4,x"])
    capsys.readouterr()
    assert main(["simulate", "--model", "gpt-9", "--rps", "1", "--duration", "1"]) == 2
    assert "shunter simulate: " in capsys.readouterr().err


def test_simulate_says_when_the_weights_do_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = {**profile_json(get_profile("h100")), "name": "small", "hbm_bytes": 8e9}
    (tmp_path / "small.json").write_text(json.dumps(small))
    argv = ["simulate", "--model", "qwen2.5-32b", "--hardware", str(tmp_path / "small.json")]
    assert main([*argv, "--rps", "1", "--duration", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shunter simulate: weights need") and "Traceback" not in err


def test_simulate_a_scenario_compares_variants_per_sharing_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json, out_html = tmp_path / "c2.json", tmp_path / "c2.html"
    argv = [
        "simulate", "--scenario", "c2", "--sharing", "temporal,spatial",
        "--variant", "none,oneiros", "--rps", "3", "--duration", "6", "--window", "2",
        "--json", str(out_json), "--plot", str(out_html),
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("SIMULATED: scenario c2 (opt-30b 65%, opt-6.7b 15%) on gh200-96g")
    assert "SIMULATED: per model" in printed
    doc = json.loads(out_json.read_text())
    assert doc["simulated"] is True and doc["config"]["hardware"] == "gh200-96g"
    results = doc["results"]
    assert [(r["sharing"], r["variant"]) for r in results] == [
        ("temporal", "none"), ("temporal", "oneiros"), ("spatial", "none"), ("spatial", "oneiros"),
    ]  # fmt: skip
    for r in results:
        assert r["scenario"] == "c2" and r["policy"] == "fcfs"
        assert set(r["models"]) == {"opt-30b", "opt-6.7b"}
        for key in ("p99_ttft_s", "p99_tpot_s", "throughput_tok_s", "slo_attainment"):
            assert key in r["models"]["opt-30b"]
        for key in ("gb_prefetched", "layers_remapped", "max_layers_remapped", "switches"):
            assert key in r
    none = [r for r in results if r["variant"] == "none"]
    assert all(r["gb_prefetched"] == 0 and r["layers_remapped"] == [] for r in none)
    assert "SIMULATED" in out_html.read_text()
    assert "SIMULATED" in (tmp_path / "c2-spatial.html").read_text()
