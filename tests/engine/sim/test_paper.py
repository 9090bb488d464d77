import json
from pathlib import Path

import pytest

from shunter.engine.sim import paper
from shunter.engine.sim.paper import (
    NO_DIFFERENCE,
    NOT_COMPARED,
    OPPOSITE,
    SAME,
    format_check,
    oneiros_check,
    superinfer_check,
)
from shunter.project.cli import main

AGREEMENTS = {SAME, OPPOSITE, NO_DIFFERENCE, NOT_COMPARED}


@pytest.fixture(scope="module")
def superinfer() -> paper.PaperCheck:
    # Two seconds of arrivals at a low rate and at one that runs out of KV memory: on an
    # H100 Qwen2.5-32B's weights leave ~7 GB of KV, and the short ShareGPT-like requests
    # take few steps to simulate.
    return superinfer_check(
        duration_s=2.0,
        runs=[("qwen2.5-32b", (2.0, 60.0))],
        workload="sharegpt",
        hardware="h100",
    )


def test_superinfer_check_pairs_both_systems_per_rate_with_the_published_figures(
    superinfer: paper.PaperCheck,
) -> None:
    assert [(r["policy"], r["rps"]) for r in superinfer.rows] == [
        ("vllm", 2.0), ("vllm", 60.0), ("superinfer", 2.0), ("superinfer", 60.0),
    ]  # fmt: skip
    assert [(r["model"], r["rps"]) for r in superinfer.table] == [
        ("qwen2.5-32b", 2.0),
        ("qwen2.5-32b", 60.0),
    ]
    published = {f.published_value for f in superinfer.figures}
    assert {74.7, 29.2} <= published
    assert {f.agreement for f in superinfer.figures} <= AGREEMENTS
    # The SLOs and VLT weights are SuperInfer's §5.2 settings.
    spec = superinfer.config["specs"][0]
    assert (spec["ttft_slo_s"], spec["tbt_slo_s"]) == (5.0, 0.1)
    assert (spec["alpha"], spec["beta_b"], spec["beta_f"]) == (3.0, 0.0, 0.5)


def test_vllm_recomputes_and_never_swaps_while_superinfer_rotates_out_of_memory(
    superinfer: paper.PaperCheck,
) -> None:
    vllm = [r for r in superinfer.rows if r["policy"] == "vllm"]
    # Recompute preemption: nothing goes to host memory, nothing comes back.
    assert all(r["gb_d2h"] == r["gb_h2d"] == r["peak_dram_gb"] == 0 for r in vllm)
    assert vllm[-1]["rotations"] > 0  # it did run out of KV memory at the top rate
    top = next(r for r in superinfer.rows if r["policy"] == "superinfer" and r["rps"] == 60.0)
    assert top["rotations"] > 0 and top["gb_d2h"] > 0


def result(policy: str, rps: float, ttft: float, tbt: float, tok_s: float) -> dict[str, object]:
    """A result row with the keys the SuperInfer table reads."""
    return {
        "policy": policy, "rps": rps, "ttft_attainment": ttft, "tbt_attainment": tbt,
        "slo_attainment": min(ttft, tbt), "itl_within_tbt": tbt, "p99_ttft_s": 1.0,
        "p50_tpot_s": 0.05, "throughput_tok_s": tok_s, "rotations": 0, "gb_d2h": 0.0,
        "gb_h2d": 0.0, "peak_hbm_gb": 80.0, "sim_duration_s": 130.0,
    }  # fmt: skip


def test_superinfer_figures_read_the_gaps_the_way_the_paper_states_them() -> None:
    runs = [  # (rate, vllm TTFT, superinfer TTFT, vllm TBT, superinfer TBT)
        (5.0, 1.0, 1.0, 1.0, 1.0),
        (10.0, 0.40, 0.90, 1.0, 0.97),
        (15.0, 0.20, 0.60, 1.0, 0.70),
    ]
    table = [
        paper.superinfer_table_row(
            "m", rate, result("vllm", rate, v_ttft, v_tbt, 100.0),
            result("superinfer", rate, s_ttft, s_tbt, 110.0),
        )
        for rate, v_ttft, s_ttft, v_tbt, s_tbt in runs
    ]  # fmt: skip
    assert [r["ttft_gap_points"] for r in table] == pytest.approx([0.0, 50.0, 40.0])
    assert table[1]["throughput_gain_pct"] == pytest.approx(10.0)
    figures = paper.superinfer_figures("m", table)
    gain, growth, tbt, token_tbt, low, tput, below = figures
    assert (gain.simulated, gain.agreement) == (pytest.approx(50.0), SAME)
    assert "at 10 req/s" in gain.simulated_text
    assert (growth.simulated, growth.agreement) == (pytest.approx(40.0), SAME)
    # 30 points fewer requests within the TBT target at 15 req/s: not "comparable".
    assert (tbt.simulated, tbt.agreement) == (pytest.approx(-30.0), OPPOSITE)
    assert "TPOT" in tbt.name and "token gaps" in token_tbt.name
    assert (low.simulated, low.agreement) == (0.0, SAME)
    assert tput.published_value == 29.2 and tput.agreement == SAME
    assert below.simulated == 10.0 and below.agreement == NOT_COMPARED


def test_the_printed_check_is_simulated_with_one_agreement_line_per_figure(
    superinfer: paper.PaperCheck,
) -> None:
    text = format_check(superinfer)
    assert text.startswith("SIMULATED: SuperInfer §5.2, Fig. 16")
    agreements = [line for line in text.splitlines() if line.startswith("agreement: ")]
    assert len(agreements) == len(superinfer.figures)
    assert all("SIMULATED" in line and "published" in line for line in agreements)
    assert "up to 74.7% higher TTFT SLO attainment" in text


def test_simulate_paper_oneiros_prints_and_writes_each_cell_beside_the_published_averages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The command's own check on c2 only, at one rate, to keep the test short.
    def short_check(*, duration_s: float, seed: int) -> paper.PaperCheck:
        cells = [("c2", "temporal"), ("c2", "spatial")]
        return oneiros_check(duration_s=duration_s, seed=seed, cells=cells, rates=(4.0,))

    monkeypatch.setattr(paper, "oneiros_check", short_check)
    out = tmp_path / "oneiros.json"
    assert main(["simulate", "--paper", "oneiros", "--duration", "2", "--seed", "3",
                 "--json", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.startswith("SIMULATED: Oneiros §7.2-7.3")
    assert f"SIMULATED results written to {out}" in printed
    assert len([line for line in printed.splitlines() if line.startswith("agreement: ")]) == 6

    doc = json.loads(out.read_text())
    assert doc["simulated"] is True and doc["paper"] == "oneiros"
    assert set(doc) == {"simulated", "paper", "title", "config", "results", "table", "figures"}
    spec = doc["config"]["specs"][0]
    assert (spec["seed"], spec["duration_s"], spec["arrivals"]) == (3, 2.0, "azure-code")
    assert [(r["sharing"], r["variant"]) for r in doc["results"]] == [
        ("temporal", "none"), ("temporal", "oneiros"), ("spatial", "none"), ("spatial", "oneiros"),
    ]  # fmt: skip
    assert [(c["scenario"], c["sharing"], c["rps"]) for c in doc["table"]] == [
        ("c2", "temporal", 4.0),
        ("c2", "spatial", 4.0),
    ]
    for cell in doc["table"]:
        none, oneiros = cell["none_p99_ttft_s"], cell["oneiros_p99_ttft_s"]
        assert cell["ttft_reduction_pct"] == pytest.approx(100 * (none - oneiros) / none)
    figures = {f["name"]: f for f in doc["figures"]}
    temporal = figures["c2 temporal: P99 TTFT reduction (%)"]
    assert temporal["published_value"] == 74.8 and temporal["agreement"] != NOT_COMPARED
    assert temporal["simulated"] == pytest.approx(doc["table"][0]["ttft_reduction_pct"])
    assert figures["c2 temporal: P99 TBT reduction (%)"]["published_value"] == 44.8
    assert figures["c2 temporal: throughput gain (%)"]["published_value"] == 45.3
    # §7.3 evaluates spatial sharing on C1 only.
    spatial = [f for f in doc["figures"] if f["name"].startswith("c2 spatial")]
    assert len(spatial) == 3 and {f["agreement"] for f in spatial} == {NOT_COMPARED}


def test_simulate_paper_refuses_the_options_it_would_ignore(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--paper", "superinfer", "--rps", "4"]) == 2
    assert "--paper runs the paper's own settings" in capsys.readouterr().err


def test_the_oneiros_check_schedules_both_systems_as_vllm_v0_without_chunked_prefill() -> None:
    # vLLM v0.7.3's V0 engine: whole prompts in steps of their own, up to one context.
    for scenario, tokens in (("c1", 8192), ("c2", 2048)):
        spec = paper.oneiros_spec(scenario, ("temporal",), (1.0,), duration_s=1.0, seed=0)
        for variant in spec.variants:
            scheduler = spec.sim_config(variant, "temporal").scheduler
            assert not scheduler.chunked_prefill
            assert scheduler.max_batch_tokens == tokens
