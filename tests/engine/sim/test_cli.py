import json
from pathlib import Path

import pytest

from shunter.engine.sim.hardware import get_profile, profile_json
from shunter.engine.workload.requests import WorkloadRequest
from shunter.engine.workload.traces import write_trace
from shunter.project.cli import main


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


def test_a_scenario_honours_the_vlt_and_swap_knobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "c2.json"
    argv = [
        "simulate", "--scenario", "c2", "--variant", "rotasched", "--rps", "2",
        "--duration", "4", "--window", "2", "--alpha", "1", "--beta-b", "0.5", "--beta-f", "2",
        "--swap-bandwidth-scale", "0.05", "--xfer-budget", "300", "--json", str(out_json),
    ]  # fmt: skip
    assert main(argv) == 0
    assert "swap bandwidth x0.05" in capsys.readouterr().out
    config = json.loads(out_json.read_text())["config"]
    assert (config["alpha"], config["beta_b"], config["beta_f"]) == (1.0, 0.5, 2.0)
    assert config["swap_bandwidth_scale"] == 0.05
    assert config["xfer_budget_bytes"] == 300 * 4 * 2**20


def _trace(path: Path, rows: list[tuple[float, int, int, str]]) -> str:
    write_trace(path, [WorkloadRequest(*row) for row in rows])
    return str(path)


def test_simulate_replays_a_single_model_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(
        tmp_path / "t.jsonl",
        [(0.0, 100, 20, "llama-3-8b"), (0.5, 300, 10, "llama-3-8b"), (2.0, 50, 5, "llama-3-8b")],
    )
    out_json = tmp_path / "out.json"
    argv = ["simulate", "--model", "llama-3-8b", "--hardware", "h100", "--policy", "fcfs,lvf"]
    assert main([*argv, "--trace", trace, "--json", str(out_json)]) == 0
    assert f"trace {trace}" in capsys.readouterr().out
    doc = json.loads(out_json.read_text())
    assert doc["config"]["workload"] == "JSONL trace"
    for r in doc["results"]:
        assert r["num_requests"] == r["num_succeeded"] == 3
        assert r["rps"] == 1.5  # 3 requests over the 2 s up to the last arrival
        assert r["sim_duration_s"] >= 2.0


def test_simulate_replays_a_two_model_trace_in_a_scenario(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [(0.0, 200, 16, "opt-30b"), (0.2, 100, 8, "opt-6.7b"), (1.0, 64, 8, "opt-6.7b")]
    trace = _trace(tmp_path / "t.jsonl", rows)
    out_json = tmp_path / "out.json"
    argv = ["simulate", "--scenario", "c2", "--variant", "none,combined", "--trace", trace]
    assert main([*argv, "--json", str(out_json)]) == 0
    capsys.readouterr()
    results = json.loads(out_json.read_text())["results"]
    assert [r["variant"] for r in results] == ["none", "combined"]
    for r in results:
        assert r["num_succeeded"] == 3
        assert {m: v["num_requests"] for m, v in r["models"].items()} == {
            "opt-30b": 1,
            "opt-6.7b": 2,
        }


def test_simulate_refuses_a_trace_naming_a_model_not_in_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path / "t.jsonl", [(0.0, 10, 2, "opt-30b"), (0.1, 10, 2, "llama-3-8b")])
    assert main(["simulate", "--scenario", "c2", "--trace", trace]) == 2
    err = capsys.readouterr().err
    assert "names llama-3-8b, not served" in err and "opt-6.7b" in err
    assert main(["simulate", "--model", "opt-30b", "--trace", trace]) == 2
    assert "names llama-3-8b" in capsys.readouterr().err
    # The trace brings its own arrivals: knobs that shape generated ones are refused.
    assert main(["simulate", "--model", "opt-30b", "--trace", trace, "--rps", "4"]) == 2
    assert "drop --rps" in capsys.readouterr().err
    assert main(["simulate", "--model", "opt-30b", "--trace", str(tmp_path / "none.jsonl")]) == 2
    assert "cannot read trace" in capsys.readouterr().err


def test_simulate_records_the_named_workload_and_arrivals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "out.json"
    argv = [
        "simulate", "--model", "llama-3-8b", "--hardware", "h100", "--policy", "fcfs",
        "--rps", "2", "--duration", "3", "--workload", "lmsys", "--arrivals", "azure-conv",
        "--json", str(out_json),
    ]  # fmt: skip
    assert main(argv) == 0
    assert "3 s of azure-conv arrivals, lmsys lengths" in capsys.readouterr().out
    config = json.loads(out_json.read_text())["config"]
    assert (config["workload_name"], config["arrivals"]) == ("lmsys", "azure-conv")
    assert config["workload"].startswith("LMSYS-Chat-1M") and config["workload_sources"]
    assert config["arrival_process"]["cv"] == 1.094 and config["arrival_process"]["sources"]

    scenario = ["simulate", "--scenario", "c2", "--variant", "none", "--rps", "2"]
    scenario += ["--duration", "2", "--window", "1", "--cv", "2", "--json", str(out_json)]
    assert main([*scenario, "--workload", "sharegpt-gen"]) == 0
    assert "2 s of gamma:2.0 arrivals, sharegpt-gen lengths" in capsys.readouterr().out
    config = json.loads(out_json.read_text())["config"]
    assert config["arrival_process"]["name"] == "gamma:2.0" and config["cv"] == 2.0
    assert config["workload"].endswith(", per-model gamma arrivals")


def test_simulate_refuses_unknown_or_conflicting_workload_knobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["simulate", "--model", "llama-3-8b", "--hardware", "h100", "--rps", "1"]
    refused = {
        "unknown workload 'alpaca'": ["--workload", "alpaca"],
        "unknown arrivals 'bursty'": ["--arrivals", "bursty"],
        "(--cv CV is --arrivals gamma:CV): give one": ["--cv", "2", "--arrivals", "azure-code"],
        "replaces the lmsys workload": ["--sharegpt", "x.json", "--workload", "lmsys"],
    }
    for message, knobs in refused.items():
        assert main([*base, *knobs]) == 2
        assert message in capsys.readouterr().err
    trace = _trace(tmp_path / "t.jsonl", [(0.0, 10, 2, "llama-3-8b")])
    argv = ["simulate", "--model", "llama-3-8b", "--trace", trace, "--workload", "lmsys"]
    assert main([*argv, "--arrivals", "poisson"]) == 2
    assert "drop --workload, --arrivals" in capsys.readouterr().err
