import dataclasses
import json
import random
import statistics
from pathlib import Path

import pytest

from shunter.engine.sim.workload import (
    ARRIVALS,
    AZURE_CODE_CV,
    AZURE_CONV_CV,
    DATA_DIR,
    LMSYS_OUTPUT_MEAN,
    LMSYS_PROMPT_MEAN,
    SAMPLE_TRACES,
    SHAREGPT_OUTPUT_MEAN,
    SHAREGPT_PROMPT_MEAN,
    WORKLOADS,
    Percentiles,
    WorkloadRequest,
    fixed_lengths,
    gamma_arrivals,
    get_arrivals,
    get_workload,
    lengths_from,
    load_sharegpt,
    poisson_arrivals,
    read_trace,
    resample,
    resolve_arrivals,
    sample_trace,
    sharegpt_like,
    synthetic_workload,
    write_trace,
)


def test_same_seed_same_workload_other_seed_other_workload() -> None:
    a = synthetic_workload(rate=8, duration_s=30, model="m", seed=1)
    b = synthetic_workload(rate=8, duration_s=30, model="m", seed=1)
    c = synthetic_workload(rate=8, duration_s=30, model="m", seed=2)
    assert a == b
    assert a != c
    assert len(a) == 240


@pytest.mark.parametrize("rate", [0.5, 4.0, 20.0])
def test_poisson_arrivals_have_the_requested_rate(rate: float) -> None:
    times = poisson_arrivals(rate, 20_000, random.Random(0))
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert times == sorted(times)
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.03)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_arrivals_keep_the_rate_and_set_burstiness(cv: float) -> None:
    times = gamma_arrivals(10.0, cv, 40_000, random.Random(3))
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.05)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1)


def test_sharegpt_like_lengths_follow_the_published_means_within_the_filter() -> None:
    rng = random.Random(0)
    pairs = [sharegpt_like(rng) for _ in range(20_000)]
    prompts = [p for p, _ in pairs]
    outputs = [o for _, o in pairs]
    assert all(4 <= p <= 1024 and o >= 4 and p + o <= 2048 for p, o in pairs)
    # The length filter trims the tails, so the means land a little below the source's.
    assert 0.8 * SHAREGPT_PROMPT_MEAN < statistics.fmean(prompts) < SHAREGPT_PROMPT_MEAN
    assert 0.8 * SHAREGPT_OUTPUT_MEAN < statistics.fmean(outputs) < SHAREGPT_OUTPUT_MEAN


def test_jsonl_trace_round_trip(tmp_path: Path) -> None:
    requests = synthetic_workload(rate=4, duration_s=5, model="qwen2.5-32b", seed=7)
    path = tmp_path / "trace.jsonl"
    write_trace(path, requests)
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"t", "prompt_tokens", "output_tokens", "model"}
    assert read_trace(path) == requests


def test_read_trace_sorts_and_reports_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"t": 2.0, "prompt_tokens": 5, "output_tokens": 6, "model": "a"}\n\n'
        '{"t": 1.0, "prompt_tokens": 7, "output_tokens": 8, "model": "b"}\n'
    )
    assert [r.model for r in read_trace(path)] == ["b", "a"]
    path.write_text('{"t": 1.0, "prompt_tokens": 7}\n')
    with pytest.raises(ValueError, match=":1:"):
        read_trace(path)


def test_sharegpt_loader_takes_first_human_turn_and_its_reply(tmp_path: Path) -> None:
    data = [
        {
            "id": "a",
            "conversations": [
                {"from": "human", "value": "one two three four five"},
                {"from": "gpt", "value": "six seven eight nine ten eleven"},
                {"from": "human", "value": "ignored follow-up question here"},
                {"from": "gpt", "value": "ignored"},
            ],
        },
        # Starts with the model: the first human turn is the second one.
        {
            "id": "b",
            "conversations": [
                {"from": "gpt", "value": "hello there friend of mine"},
                {"from": "human", "value": "w1 w2 w3 w4"},
                {"from": "gpt", "value": "r1 r2 r3 r4 r5"},
            ],
        },
        # No reply: skipped.
        {"id": "c", "conversations": [{"from": "human", "value": "a b c d e"}]},
        # Too short a reply for vLLM's filter: skipped.
        {
            "id": "d",
            "conversations": [
                {"from": "human", "value": "a b c d e"},
                {"from": "gpt", "value": "ok"},
            ],
        },
        {"id": "e", "conversations": []},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    words = lambda text: len(text.split())  # noqa: E731
    assert load_sharegpt(path, words) == [(5, 6), (4, 5)]
    # The default estimates four characters per token.
    assert load_sharegpt(path)[0] == (round(len("one two three four five") / 4), 8)


def test_samplers_and_request_validation() -> None:
    rng = random.Random(0)
    assert fixed_lengths(10, 20)(rng) == (10, 20)
    pool = [(1, 2), (3, 4)]
    assert {resample(pool)(rng) for _ in range(50)} == set(pool)
    with pytest.raises(ValueError):
        resample([])
    with pytest.raises(ValueError):
        WorkloadRequest(0.0, 0, 5, "m")


# --- named workloads and arrival processes -----------------------------------------------


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *times], times, strict=False)]


@pytest.mark.parametrize(("name", "cv"), [("azure-code", AZURE_CODE_CV), ("azure-conv", 1.094)])
def test_azure_arrivals_have_the_traces_coefficient_of_variation(name: str, cv: float) -> None:
    process = get_arrivals(name)
    assert process.cv == cv and process.sources
    gaps = _gaps(gamma_arrivals(10.0, process.cv, 200_000, random.Random(0)))
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.05)
    # The coding trace's CV of 13 makes a sample's CV converge slowly (kurtosis ~1000).
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1)


def test_arrival_names_and_the_cv_alias() -> None:
    assert get_arrivals("poisson").cv == 1.0 and AZURE_CONV_CV < AZURE_CODE_CV
    assert set(ARRIVALS) == {"poisson", "azure-code", "azure-conv"}
    assert get_arrivals("gamma:2.5").cv == 2.5
    assert resolve_arrivals("poisson", 2.5).cv == 2.5  # --cv 2.5 is gamma:2.5
    assert resolve_arrivals("azure-code", 1.0).cv == AZURE_CODE_CV
    for bad in ("gamma:x", "gamma:0", "gamma:-1", "gamma:inf", "bursty"):
        with pytest.raises(ValueError, match="gamma:CV"):
            get_arrivals(bad)
    with pytest.raises(ValueError, match="give one"):
        resolve_arrivals("azure-code", 2.0)


def _draw(name: str, n: int, seed: int = 0) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [WORKLOADS[name].lengths(rng) for _ in range(n)]


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_each_workload_is_a_function_of_its_seed(name: str) -> None:
    assert _draw(name, 500, seed=1) == _draw(name, 500, seed=1)
    assert _draw(name, 500, seed=1) != _draw(name, 500, seed=2)
    assert WORKLOADS[name].description and WORKLOADS[name].sources


def test_sharegpt_stays_the_default_workload() -> None:
    assert lengths_from(None) is sharegpt_like is WORKLOADS["sharegpt"].lengths
    rng = random.Random(0)
    assert [sharegpt_like(rng) for _ in range(3)] == [(81, 212), (197, 186), (402, 44)]
    default = synthetic_workload(rate=4, duration_s=50, model="llama-3-8b", seed=0)
    assert default == sample_trace("sharegpt")


def test_sharegpt_gen_has_long_generated_outputs_and_short_prompts() -> None:
    pairs = _draw("sharegpt-gen", 50_000)
    outputs = [o for _, o in pairs]
    assert all(4 <= p <= 1024 for p, _ in pairs)
    assert all(4 <= o <= 8192 for o in outputs)
    # CASTILLO measured 1.65% of outputs above 2,048 and 0.44% above 8,192 (cut there).
    assert 0.01 < sum(o > 2048 for o in outputs) / len(outputs) < 0.03
    assert 0.002 < outputs.count(8192) / len(outputs) < 0.008
    assert any(p + o > 2048 for p, o in pairs)  # no total-length filter
    assert 500 < statistics.median(outputs) < 580  # CASTILLO's median: 536


def test_lmsys_lengths_follow_the_published_means() -> None:
    pairs = _draw("lmsys", 100_000)
    assert all(4 <= p <= 1024 and 4 <= o <= 8192 for p, o in pairs)
    # The limits cut well under 0.1% of each tail: the means stay the dataset's.
    assert statistics.fmean(p for p, _ in pairs) == pytest.approx(LMSYS_PROMPT_MEAN, rel=0.02)
    assert statistics.fmean(o for _, o in pairs) == pytest.approx(LMSYS_OUTPUT_MEAN, rel=0.02)


@pytest.mark.parametrize(
    ("name", "prompt_median", "output_median"),
    [("azure-code", 1469, 13), ("azure-conv", 1020, 129)],
)
def test_azure_lengths_follow_the_traces_token_counts(
    name: str, prompt_median: int, output_median: int
) -> None:
    pairs = _draw(name, 50_000)
    assert statistics.median(p for p, _ in pairs) == pytest.approx(prompt_median, rel=0.03)
    assert statistics.median(o for _, o in pairs) == pytest.approx(output_median, rel=0.05)


def test_percentiles_draw_within_the_measured_range() -> None:
    column = Percentiles("azure-conv", "output_tokens")
    draws = [column(random.Random(seed)) for seed in range(2_000)]
    assert min(draws) >= 7 and max(draws) <= 1000  # GeneratedTokens' min and max


def test_workload_names_are_checked() -> None:
    with pytest.raises(ValueError, match="choose from sharegpt, sharegpt-gen, lmsys"):
        get_workload("alpaca")
    assert get_workload("sharegpt", "file.json").name == "sharegpt"
    with pytest.raises(ValueError, match="replaces the lmsys workload"):
        lengths_from("file.json", "lmsys")


@pytest.mark.parametrize("name", list(SAMPLE_TRACES))
def test_shipped_sample_traces_are_what_the_generator_makes(name: str) -> None:
    path = DATA_DIR / f"{name}.jsonl"
    assert read_trace(path) == sample_trace(name), (
        f"{path} drifted from the generator: if intended, rewrite it with "
        f"write_trace(DATA_DIR / '{name}.jsonl', sample_trace('{name}'))"
    )
    assert len(sample_trace(name)) == 200


def test_every_shipped_trace_is_a_named_sample() -> None:
    assert {p.stem for p in DATA_DIR.glob("*.jsonl")} == set(SAMPLE_TRACES)
    assert set(SAMPLE_TRACES) <= set(WORKLOADS)


def test_sweeps_and_scenarios_generate_the_named_workload_and_arrivals() -> None:
    from shunter.engine.sim.mix import mixed_workload
    from shunter.engine.sim.scenario import get_scenario
    from shunter.engine.sim.scenario_sweep import ScenarioSpec
    from shunter.engine.sim.sweep import SweepSpec

    spec = SweepSpec("llama-3-8b", "h100", ("fcfs",), (4.0,), 50.0, 5.0, 0.1)
    for name in SAMPLE_TRACES:
        named = dataclasses.replace(spec, workload_name=name, arrivals=SAMPLE_TRACES[name][1])
        assert named.workload(4.0, named.lengths()) == sample_trace(name)
    gamma = dataclasses.replace(spec, arrivals="gamma:2")
    cv = dataclasses.replace(spec, cv=2.0)
    assert gamma.workload(4.0, gamma.lengths()) == cv.workload(4.0, cv.lengths())
    with pytest.raises(ValueError, match="give one"):
        dataclasses.replace(spec, cv=2.0, arrivals="azure-code")

    scenario = ScenarioSpec(
        "c2", ("spatial",), ("none",), (4.0,), duration_s=20.0, arrivals="azure-conv",
        workload_name="lmsys",
    )  # fmt: skip
    loads = get_scenario("c2").loads(
        "spatial", 4.0, window_s=30.0, cv=AZURE_CONV_CV, lengths=WORKLOADS["lmsys"].lengths
    )
    assert scenario.workload("spatial", 4.0) == mixed_workload(loads, duration_s=20.0, seed=0)
