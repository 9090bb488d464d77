"""``shunter simulate --paper``: a paper's own evaluation settings run through the
simulator, each simulated figure printed beside the published one.

- ``superinfer``: SuperInfer §5.2, Fig. 16: the ``vllm`` and ``superinfer`` baselines
  (``sim/baselines.py``) on a GH200 at the rates of the paper's released evaluation
  script, SLOs and VLT weights of §5.2; TTFT, TBT and both attainment per rate, and the
  comparisons the text draws from the figure.
- ``oneiros``: Oneiros §7.2-7.3, Figs. 8 and 12: scenarios c1 and c2 (Table 1), temporal
  and spatial sharing, ``none`` (vLLM) against ``oneiros``; P99 TTFT and P99 TBT
  reductions and the throughput gain per cell, averaged as the paper averages them.

Published values are quoted with their section; every simulated one is SIMULATED. A
figure's agreement says whether the simulated change points the way the paper's does,
not whether its size matches.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shunter.engine.sim import report
from shunter.engine.sim.report import LABEL, Column, Row
from shunter.engine.sim.scenario import get_scenario
from shunter.engine.sim.scenario_sweep import ScenarioSpec, scenario_rows
from shunter.engine.sim.sweep import SweepSpec, sweep_rows
from shunter.engine.workload.lengths import get_workload

PAPERS = ("superinfer", "oneiros")

SAME = "same direction"
OPPOSITE = "opposite direction"
NO_DIFFERENCE = "no difference"
NOT_COMPARED = "not compared"

# How far apart two attainments may be and still be "comparable" (SuperInfer §5.2: TBT
# "superior or comparable to baselines") or "match" (§1: at low rates SuperInfer
# "matches baseline performance"): the check's reading of those words, in points.
COMPARABLE_POINTS = 5.0
# A simulated change under 1 (point of attainment, or percent) is no difference: runs
# that differ by a handful of requests or a rounding are not a direction.
NO_CHANGE = 1.0


@dataclass(frozen=True)
class Figure:
    """One published figure beside its simulated counterpart. ``published_value`` is
    None where the paper gives a trend, not a number; ``simulated`` is in the unit the
    name states (points of attainment, percent, req/s), None where the runs give none."""

    name: str
    source: str
    published: str
    published_value: float | None
    simulated: float | None
    simulated_text: str
    agreement: str


@dataclass(frozen=True)
class PaperCheck:
    """A check's runs: ``rows`` are every simulated run's result row, ``table`` one row
    per rate (superinfer) or cell (oneiros) pairing the two systems, printed with
    ``columns``; ``figures`` are the published figures beside the simulated ones."""

    paper: str
    title: str
    config: dict[str, Any]
    rows: list[Row]
    table: list[Row]
    columns: tuple[Column, ...]
    figures: list[Figure]


def _direction(simulated: float | None, published: float) -> str:
    """Whether a simulated change has the published change's sign."""
    if simulated is None:
        return NOT_COMPARED
    if abs(simulated) < NO_CHANGE:
        return NO_DIFFERENCE
    return SAME if (simulated > 0) == (published > 0) else OPPOSITE


def _within(simulated: float | None, lowest: float, highest: float) -> str:
    if simulated is None:
        return NOT_COMPARED
    return SAME if lowest <= simulated <= highest else OPPOSITE


# --- SuperInfer -------------------------------------------------------------------------

# Model and ShareGPT rates (req/s) of SuperInfer's released evaluation script
# (Supercomputing-System-AI-Lab/SuperInfer@790d1fad, AE_AIO_0309_v1.py:40-47), 120 s of
# Poisson arrivals each (:55; api_client.py: gamma arrivals with --burstiness 1).
SUPERINFER_RUNS: tuple[tuple[str, tuple[float, ...]], ...] = (
    ("qwen2.5-32b", (5.0, 10.0, 13.0, 15.0, 18.0, 20.0)),
    ("llama-3-8b", (35.0, 40.0, 45.0, 50.0, 55.0, 60.0)),
)
SUPERINFER_DURATION_S = 120.0
# §5.2: "TTFT and TBT SLOs are set to 5s and 100ms"; alpha = 3, beta_B = 0, beta_F = 0.5.
SUPERINFER_TTFT_SLO_S, SUPERINFER_TBT_SLO_S = 5.0, 0.1
SUPERINFER_VLT = (3.0, 0.0, 0.5)  # alpha, beta_B, beta_F
# §5.3.6: "up to 29.2% improvement [in throughput] at high request rates".
SUPERINFER_THROUGHPUT_GAIN = 29.2
# Abstract and §1: "up to 74.7% higher TTFT SLO attainment" (against all baselines).
SUPERINFER_TTFT_GAIN = 74.7
SUPERINFER_PAIR = ("vllm", "superinfer")
SUPERINFER_WORKLOAD = "sharegpt-gen"
# §5.1: "NVIDIA GH200 NVL2 ... 144GB of HBM and 480GB of DRAM" per Superchip, one used.
SUPERINFER_HARDWARE = "gh200"


def superinfer_spec(
    model: str,
    rates: Sequence[float],
    *,
    duration_s: float,
    seed: int,
    workload: str = SUPERINFER_WORKLOAD,
    hardware: str = SUPERINFER_HARDWARE,
) -> SweepSpec:
    """The sweep of one of SuperInfer's models: both systems at ``rates`` on
    ``hardware``, by default the paper's GH200.

    Requests are ``workload``'s (``workload.WORKLOADS``): by default ShareGPT prompts
    with generated outputs up to 8,192 tokens, the shape of the trace SuperInfer's
    client replays (``sharegpt-gen``); arrivals are Poisson.
    """
    return SweepSpec(
        model=model,
        hardware=hardware,
        policies=SUPERINFER_PAIR,
        rates=tuple(rates),
        duration_s=duration_s,
        seed=seed,
        workload_name=workload,
        arrivals="poisson",
        ttft_slo_s=SUPERINFER_TTFT_SLO_S,
        tbt_slo_s=SUPERINFER_TBT_SLO_S,
        alpha=SUPERINFER_VLT[0],
        beta_b=SUPERINFER_VLT[1],
        beta_f=SUPERINFER_VLT[2],
    )


def _paired(base: Row, other: Row, keys: Sequence[str]) -> Row:
    """``base``'s and ``other``'s values of ``keys``, prefixed by their policy names."""
    return {
        **{f"{base['policy']}_{k}": base[k] for k in keys},
        **{f"{other['policy']}_{k}": other[k] for k in keys},
    }


SUPERINFER_KEYS = (
    "ttft_attainment",
    "tbt_attainment",
    "slo_attainment",
    "itl_within_tbt",
    "p99_ttft_s",
    "p50_tpot_s",
    "throughput_tok_s",
    "rotations",
    "gb_d2h",
    "gb_h2d",
    "peak_hbm_gb",
    "sim_duration_s",
)
SUPERINFER_COLUMNS: tuple[Column, ...] = (
    ("model", "model", "{}"),
    ("rps", "rps", "{:g}"),
    ("vllm TTFT", "vllm_ttft_attainment", "{:.1%}"),
    ("TBT", "vllm_tbt_attainment", "{:.1%}"),
    ("both", "vllm_slo_attainment", "{:.1%}"),
    ("superinfer TTFT", "superinfer_ttft_attainment", "{:.1%}"),
    ("TBT", "superinfer_tbt_attainment", "{:.1%}"),
    ("both", "superinfer_slo_attainment", "{:.1%}"),
    ("gap TTFT", "ttft_gap_points", "{:+.1f}"),
    ("TBT", "tbt_gap_points", "{:+.1f}"),
    ("gaps<=TBT", "gap_tbt_pair", "{}"),
    ("TTFT p99 s", "p99_ttft_pair", "{}"),
    ("TPOT p50 s", "p50_tpot_pair", "{}"),
    ("preempted", "preempt_pair", "{}"),
    ("GB H2D", "superinfer_gb_h2d", "{:.0f}"),
    ("HBM GB", "hbm_pair", "{}"),
    ("done s", "done_pair", "{}"),
)
"""Each ``a/b`` column is vllm's value, then superinfer's. Gaps are superinfer - vllm
in points; ``gaps<=TBT`` is the share of token gaps within S_B over all requests' gaps
pooled, as SuperInfer's client pools them (api_client.py:137-140); ``done s`` is when
the last request finished (arrivals stop at the duration)."""


def superinfer_table_row(model: str, rate: float, vllm: Row, superinfer: Row) -> Row:
    """One rate of one model: both systems' attainments, the gaps in points
    (superinfer - vllm) and the counters that explain them."""
    row: Row = {"model": model, "rps": rate, **_paired(vllm, superinfer, SUPERINFER_KEYS)}
    for name, key in (("ttft", "ttft_attainment"), ("tbt", "tbt_attainment"),
                      ("slo", "slo_attainment"), ("token_tbt", "itl_within_tbt")):  # fmt: skip
        row[f"{name}_gap_points"] = _points(vllm[key], superinfer[key])
    row["throughput_gain_pct"] = _gain(vllm["throughput_tok_s"], superinfer["throughput_tok_s"])
    pairs = (
        ("gap_tbt", "itl_within_tbt", "{:.1%}"),
        ("p99_ttft", "p99_ttft_s", "{:.3g}"),
        ("p50_tpot", "p50_tpot_s", "{:.3f}"),
        ("preempt", "rotations", "{}"),
        ("hbm", "peak_hbm_gb", "{:.0f}"),
        ("done", "sim_duration_s", "{:.0f}"),
    )
    for name, key, fmt in pairs:
        row[f"{name}_pair"] = "/".join(
            "-" if r[key] is None else fmt.format(r[key]) for r in (vllm, superinfer)
        )
    return row


def _points(base: float | None, other: float | None) -> float | None:
    return None if base is None or other is None else 100 * (other - base)


def _gain(base: float | None, other: float | None) -> float | None:
    """``other`` over ``base`` in percent above it."""
    if base is None or other is None or base == 0:
        return None
    return 100 * (other - base) / base


def _reduction(base: float | None, other: float | None) -> float | None:
    """How much lower ``other`` is than ``base``, in percent of ``base``."""
    if base is None or other is None or base == 0:
        return None
    return 100 * (base - other) / base


def _tbt_figure(model: str, table: Sequence[Row], key: str, reading: str) -> Figure:
    """§5.2's TBT claim on one reading of TBT attainment: the lowest gap across rates."""
    rows = [r for r in table if r[key] is not None]
    worst = min(rows, key=lambda r: r[key], default=None)
    return Figure(
        f"{model}: lowest TBT-attainment gap, {reading}, superinfer - vllm (points)",
        "§5.2, Fig. 16",
        "TBT SLO attainment superior or comparable to baselines",
        None,
        None if worst is None else worst[key],
        "-"
        if worst is None
        else f"{worst[key]:+.1f} points at {worst['rps']:g} req/s "
        f"(comparable: >= -{COMPARABLE_POINTS:g})",
        _within(None if worst is None else worst[key], -COMPARABLE_POINTS, float("inf")),
    )


def superinfer_figures(model: str, table: Sequence[Row]) -> list[Figure]:
    """The comparisons SuperInfer's text draws from Fig. 16 (and Fig. 23's throughput),
    on one model's rows (one per rate, ascending)."""
    low, high = table[0], table[-1]
    best = max(table, key=lambda r: r["ttft_gap_points"])
    gains = [r for r in table if r["throughput_gain_pct"] is not None]
    best_tput = max(gains, key=lambda r: r["throughput_gain_pct"], default=None)
    below = next((r for r in table if r["vllm_ttft_attainment"] < 0.5), None)
    growth = high["ttft_gap_points"] - low["ttft_gap_points"]
    tput = None if best_tput is None else best_tput["throughput_gain_pct"]
    return [
        Figure(
            f"{model}: largest TTFT-attainment gain, superinfer - vllm (points)",
            "abstract, §1, Fig. 16",
            f"up to {SUPERINFER_TTFT_GAIN}% higher TTFT SLO attainment",
            SUPERINFER_TTFT_GAIN,
            best["ttft_gap_points"],
            f"{best['ttft_gap_points']:+.1f} points at {best['rps']:g} req/s",
            _direction(best["ttft_gap_points"], SUPERINFER_TTFT_GAIN),
        ),
        Figure(
            f"{model}: TTFT gain at the highest rate less at the lowest (points)",
            "§5.2, Fig. 16",
            "surpasses baselines in TTFT SLO attainment especially at high request rates",
            None,
            growth,
            f"{high['ttft_gap_points']:+.1f} at {high['rps']:g} req/s, "
            f"{low['ttft_gap_points']:+.1f} at {low['rps']:g} req/s",
            _direction(growth, 1.0),
        ),
        _tbt_figure(model, table, "tbt_gap_points", "requests with TPOT <= S_B"),
        _tbt_figure(model, table, "token_tbt_gap_points", "token gaps <= S_B, pooled"),
        Figure(
            f"{model}: both-SLO gap at the lowest rate (points)",
            "§1",
            "at low request rates, where memory is sufficient, SuperInfer matches baseline "
            "performance",
            None,
            low["slo_gap_points"],
            f"{low['slo_gap_points']:+.1f} points at {low['rps']:g} req/s "
            f"(matches: within {COMPARABLE_POINTS:g})",
            _within(low["slo_gap_points"], -COMPARABLE_POINTS, COMPARABLE_POINTS),
        ),
        Figure(
            f"{model}: largest throughput gain, superinfer over vllm (%)",
            "§5.3.6, Fig. 23",
            f"comparable or slightly better, up to {SUPERINFER_THROUGHPUT_GAIN}% at high rates",
            SUPERINFER_THROUGHPUT_GAIN,
            tput,
            "-" if best_tput is None else f"{tput:+.1f}% at {best_tput['rps']:g} req/s",
            _direction(tput, SUPERINFER_THROUGHPUT_GAIN),
        ),
        Figure(
            f"{model}: first rate where vllm's TTFT attainment is below 50% (req/s)",
            "Fig. 16 (values only in the figure)",
            "not stated in the text",
            None,
            None if below is None else below["rps"],
            "never, up to the highest rate"
            if below is None
            else f"{below['rps']:g} req/s: vllm {below['vllm_ttft_attainment']:.1%}, "
            f"superinfer {below['superinfer_ttft_attainment']:.1%}",
            NOT_COMPARED,
        ),
    ]


def superinfer_check(
    *,
    duration_s: float = SUPERINFER_DURATION_S,
    seed: int = 0,
    runs: Sequence[tuple[str, Sequence[float]]] = SUPERINFER_RUNS,
    workload: str = SUPERINFER_WORKLOAD,
    hardware: str = SUPERINFER_HARDWARE,
) -> PaperCheck:
    """SuperInfer's Fig. 16 comparison of vLLM and SuperInfer for each of ``runs``
    (model, rates), requests of ``workload``, on ``hardware`` (a profile name)."""
    rows: list[Row] = []
    table: list[Row] = []
    figures: list[Figure] = []
    specs = [
        superinfer_spec(
            m, rates, duration_s=duration_s, seed=seed, workload=workload, hardware=hardware
        )
        for m, rates in runs
    ]
    for spec in specs:
        model_rows = [{"model": spec.model, **r} for r in sweep_rows(spec)]
        rows += model_rows
        model_table = []
        for rate in sorted(spec.rates):
            by_policy = {r["policy"]: r for r in model_rows if r["rps"] == rate}
            vllm, superinfer = (by_policy[p] for p in SUPERINFER_PAIR)
            model_table.append(superinfer_table_row(spec.model, rate, vllm, superinfer))
        table += model_table
        figures += superinfer_figures(spec.model, model_table)
    first = specs[0]
    return PaperCheck(
        paper="superinfer",
        title=f"SuperInfer §5.2, Fig. 16: vllm against superinfer on {first.hardware}, "
        f"{first.duration_s:g} s per rate of {first.arrival_process.name} arrivals, "
        f"{first.workload_name} lengths ({get_workload(first.workload_name).description}), "
        f"SLO TTFT {first.ttft_slo_s:g} s / TBT {first.tbt_slo_s:g} s, "
        f"alpha {first.alpha:g}, beta_B {first.beta_b:g}, beta_F {first.beta_f:g}",
        config={"specs": [asdict(s) for s in specs]},
        rows=rows,
        table=table,
        columns=SUPERINFER_COLUMNS,
        figures=figures,
    )


# --- Oneiros ----------------------------------------------------------------------------


@dataclass(frozen=True)
class OneirosPublished:
    """Oneiros' average P99 TBT and P99 TTFT reductions and throughput gain (percent)
    over vLLM for one scenario and sharing mode."""

    tbt_reduction: float
    ttft_reduction: float
    throughput_gain: float
    source: str


ONEIROS_PUBLISHED: dict[tuple[str, str], OneirosPublished] = {
    # §7.2: "when serving C1, ... an average reduction of 54.4% in P99 TBT latency and
    # 96.7% in P99 TTFT latency"; "a 39.9% improvement in throughput".
    ("c1", "temporal"): OneirosPublished(54.4, 96.7, 39.9, "§7.2, Fig. 8"),
    # §7.2: "when serving C2, ... 44.8% in P99 TBT latency and 74.8% in P99 TTFT";
    # "an average throughput gain of 45.3%".
    ("c2", "temporal"): OneirosPublished(44.8, 74.8, 45.3, "§7.2, Fig. 8"),
    # §7.3, non-strict physical isolation (MPS; models share the device as here): "a
    # 65.5% reduction in P99 TBT, a 20.7% reduction in P99 TTFT, and a 6.6% increase in
    # throughput". §7.3 evaluates C1 only.
    ("c1", "spatial"): OneirosPublished(65.5, 20.7, 6.6, "§7.3, Fig. 12"),
}
ONEIROS_CELLS = (("c1", "temporal"), ("c2", "temporal"), ("c1", "spatial"), ("c2", "spatial"))
# Per-model req/s while a model receives requests: from the non-peak rate Oneiros names
# (§7.6.1: "non-peak periods (1.0 RPS)"), doubling to 4, where every cell's vLLM
# baseline already preempts (measured: 427-1,780 recompute preemptions in 120 s).
# Higher rates only lengthen the runs: c2 spatial at 10 req/s takes ~25 s of wall time
# per variant (measured, 2 cores), its vLLM baseline finishing 120 s of arrivals at
# 2,655 s.
ONEIROS_RATES = (1.0, 2.0, 4.0)
ONEIROS_DURATION_S = 120.0
ONEIROS_PAIR = ("none", "oneiros")
ONEIROS_ARRIVALS = "azure-code"
ONEIROS_WORKLOAD = "sharegpt"


def oneiros_spec(
    scenario: str,
    sharing: Sequence[str],
    rates: Sequence[float],
    *,
    duration_s: float,
    seed: int,
    arrivals: str = ONEIROS_ARRIVALS,
) -> ScenarioSpec:
    """One of Oneiros' scenarios, vLLM (``none``) against ``oneiros``, on the scenario's
    GH200 (96 GB).

    Each model's gaps follow ``arrivals`` (``workload.get_arrivals``): by default those
    of Azure's coding trace, which §7.1 replays scaled to each rate; lengths are the
    ShareGPT-like ones of vLLM's benchmark (§7.1 runs ShareGPT and Alpaca).

    Both run as vLLM v0.7.3 schedules (§7.1: Oneiros is built into it), its V0 engine
    being the default there (V1 became the default in v0.8.0): without chunked prefill,
    which V0 turns on by default only past 32K tokens of context
    (``vllm/engine/arg_utils.py``), a step runs either whole prompts or decodes, and a
    recompute "pause[s] the decode process for all active requests" (§7.2;
    ``vllm/core/scheduler.py``, ``_schedule_default``: "Don't schedule decodes if
    prefills are scheduled"). A step of prompts holds at most one context of its model
    (V0's ``max_num_batched_tokens`` default, ``max(max_model_len, 2048)`` in
    ``vllm/config.py``; every model here has at least 2,048).
    """
    models = get_scenario(scenario).models
    return ScenarioSpec(
        scenario=scenario,
        sharing=tuple(sharing),
        variants=ONEIROS_PAIR,
        rates=tuple(rates),
        duration_s=duration_s,
        arrivals=arrivals,
        workload_name=ONEIROS_WORKLOAD,
        chunked_prefill=False,
        max_batch_tokens=max(m.max_context for m in models),
        seed=seed,
    )


ONEIROS_COLUMNS: tuple[Column, ...] = (
    ("scenario", "scenario", "{:<8}"),
    ("sharing", "sharing", "{:<8}"),
    ("rps", "rps", "{:>5g}"),
    ("TTFT p99 none", "none_p99_ttft_s", "{:.3f}"),
    ("oneiros", "oneiros_p99_ttft_s", "{:.3f}"),
    ("-TTFT%", "ttft_reduction_pct", "{:+.1f}"),
    ("TBT p99 none", "none_p99_itl_s", "{:.4f}"),
    ("oneiros", "oneiros_p99_itl_s", "{:.4f}"),
    ("-TBT%", "tbt_reduction_pct", "{:+.1f}"),
    ("tok/s none", "none_throughput_tok_s", "{:.0f}"),
    ("oneiros", "oneiros_throughput_tok_s", "{:.0f}"),
    ("+tok/s%", "throughput_gain_pct", "{:+.1f}"),
    ("preempt n/o", "preempt_pair", "{}"),
    ("layers", "oneiros_max_layers_remapped", "{:d}"),
    ("w-stall s", "oneiros_weight_stall_s", "{:.1f}"),
)
ONEIROS_KEYS = (
    "p99_ttft_s",
    "p99_itl_s",
    "p99_tpot_s",
    "throughput_tok_s",
    "rotations",
    "max_layers_remapped",
    "weight_stall_s",
    "gb_prefetched",
    "peak_hbm_gb",
)


def oneiros_table_row(none: Row, oneiros: Row) -> Row:
    """One cell (scenario, sharing, rate): both variants' P99 TTFT, P99 TBT (the gap
    between consecutive tokens, Oneiros §2's TBT) and throughput, Oneiros' reductions and
    gain in percent of vLLM's, and the counters that explain them."""
    pair = {"policy": "none"}, {"policy": "oneiros"}
    row: Row = {
        "scenario": none["scenario"],
        "sharing": none["sharing"],
        "rps": none["rps"],
        **_paired({**none, **pair[0]}, {**oneiros, **pair[1]}, ONEIROS_KEYS),
    }
    row["ttft_reduction_pct"] = _reduction(none["p99_ttft_s"], oneiros["p99_ttft_s"])
    row["tbt_reduction_pct"] = _reduction(none["p99_itl_s"], oneiros["p99_itl_s"])
    row["throughput_gain_pct"] = _gain(none["throughput_tok_s"], oneiros["throughput_tok_s"])
    row["preempt_pair"] = f"{none['rotations']}/{oneiros['rotations']}"
    return row


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def oneiros_figures(scenario: str, sharing: str, cells: Sequence[Row]) -> list[Figure]:
    """The averages over ``cells`` (one scenario and sharing mode, every rate) beside
    Oneiros' published averages."""
    published = ONEIROS_PUBLISHED.get((scenario, sharing))
    figures = []
    measures: tuple[tuple[str, str, Callable[[OneirosPublished], float]], ...] = (
        ("P99 TBT reduction (%)", "tbt_reduction_pct", lambda p: p.tbt_reduction),
        ("P99 TTFT reduction (%)", "ttft_reduction_pct", lambda p: p.ttft_reduction),
        ("throughput gain (%)", "throughput_gain_pct", lambda p: p.throughput_gain),
    )
    for label, key, value_of in measures:
        simulated = _mean([c[key] for c in cells])
        text = "-" if simulated is None else f"{simulated:+.1f}% (mean of {len(cells)} rates)"
        if published is None:
            figures.append(
                Figure(
                    f"{scenario} {sharing}: {label}",
                    "§7.3 evaluates spatial sharing on C1 only",
                    "none published",
                    None,
                    simulated,
                    text,
                    NOT_COMPARED,
                )
            )
            continue
        value = value_of(published)
        figures.append(
            Figure(
                f"{scenario} {sharing}: {label}",
                published.source,
                f"{value:g}% (average)",
                value,
                simulated,
                text,
                _direction(simulated, value),
            )
        )
    return figures


def oneiros_check(
    *,
    duration_s: float = ONEIROS_DURATION_S,
    seed: int = 0,
    cells: Sequence[tuple[str, str]] = ONEIROS_CELLS,
    rates: Sequence[float] = ONEIROS_RATES,
    arrivals: str = ONEIROS_ARRIVALS,
) -> PaperCheck:
    """Oneiros' Fig. 8 and Fig. 12 comparisons on ``cells`` (scenario, sharing mode) at
    ``rates`` per model."""
    scenarios = list(dict.fromkeys(s for s, _ in cells))
    specs = [
        oneiros_spec(
            s,
            [sh for sc, sh in cells if sc == s],
            rates,
            duration_s=duration_s,
            seed=seed,
            arrivals=arrivals,
        )
        for s in scenarios
    ]
    rows = [r for spec in specs for r in scenario_rows(spec)]
    table: list[Row] = []
    figures: list[Figure] = []
    for scenario, sharing in cells:
        cell_rows = []
        for rate in sorted(rates):
            by_variant = {
                r["variant"]: r
                for r in rows
                if (r["scenario"], r["sharing"], r["rps"]) == (scenario, sharing, rate)
            }
            cell_rows.append(oneiros_table_row(*(by_variant[v] for v in ONEIROS_PAIR)))
        table += cell_rows
        figures += oneiros_figures(scenario, sharing, cell_rows)
    first = specs[0]
    return PaperCheck(
        paper="oneiros",
        title=f"Oneiros §7.2-7.3, Figs. 8 and 12: none (vLLM) against oneiros on "
        f"{first.hardware_name}, {first.duration_s:g} s per rate and model of "
        f"{first.arrival_process.name} arrivals (gamma, CV {first.arrival_process.cv:g}), "
        f"{first.workload_name} lengths ({get_workload(first.workload_name).description}), "
        f"temporal window {first.window_s:g} s",
        config={"specs": [asdict(s) for s in specs]},
        rows=rows,
        table=table,
        columns=ONEIROS_COLUMNS,
        figures=figures,
    )


# --- output -----------------------------------------------------------------------------


def format_check(check: PaperCheck) -> str:
    """The check's table, headed SIMULATED, then one agreement line per published
    figure: whether the simulated change points the published way, the simulated value
    and the published one."""
    lines = [report.format_table(check.table, check.title, check.columns), ""]
    lines += [
        f"agreement: {f.name}: {f.agreement}; {LABEL} {f.simulated_text}; "
        f"published {f.published} ({f.source})"
        for f in check.figures
    ]
    return "\n".join(lines)


def check_json(check: PaperCheck) -> dict[str, Any]:
    """``{"simulated": true, "paper", "title", "config", "results", "table",
    "figures"}``: every run's row, every rate's or cell's row, every figure."""
    return {
        "simulated": True,
        "paper": check.paper,
        "title": check.title,
        "config": check.config,
        "results": check.rows,
        "table": check.table,
        "figures": [asdict(f) for f in check.figures],
    }


def run_paper(
    paper: str,
    *,
    duration_s: float | None,
    seed: int,
    json_path: str | None,
) -> int:
    """Run ``paper``'s check, print it, write its JSON if asked."""
    if paper == "superinfer":
        duration = SUPERINFER_DURATION_S if duration_s is None else duration_s
        check = superinfer_check(duration_s=duration, seed=seed)
    elif paper == "oneiros":
        duration = ONEIROS_DURATION_S if duration_s is None else duration_s
        check = oneiros_check(duration_s=duration, seed=seed)
    else:
        raise ValueError(f"unknown paper {paper!r}: choose one of {list(PAPERS)}")
    print(format_check(check))
    if json_path:
        Path(json_path).write_text(json.dumps(check_json(check), indent=2) + "\n")
        print(f"{LABEL} results written to {json_path}")
    return 0
