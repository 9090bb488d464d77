"""``shunter bench isolation --on sim``: one tenant's latency alone and beside an
aggressor, for each compared variant, on the paper's scenarios (SIMULATED).

In each scenario of ``scenario.SCENARIOS`` one model serves the *victim*, a tenant of the
``interactive`` SLO class, and another the *aggressor*, a tenant of the ``batch`` class
sending ``AGGRESSOR_RATE_FACTOR`` times the victim's rate of long prompts; any other model
of the scenario is idle (its weights are what remapping may lend). Each variant runs the
victim's requests alone, then the same requests beside the aggressor's, and the victim's
P99 TTFT and P99 TBT (the gaps between its tokens) beside the aggressor are compared with
alone; joint attainment is the share of the victim's requests meeting both its TTFT and
its TBT target (``metrics.summarize``).

Spatial sharing only: both models execute in every step they have work, so what the
victim loses is what the aggressor takes (steps, KV memory, lent layers). Under temporal
sharing the victim waits for its turn whatever the aggressor sends, by design.

Pure: no torch. The engine's own run of the same comparison is
``engine.server.bench_isolation_variants``; both print their rows with ``format_row``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from shunter.engine.benchfigure import BenchFigure, ReportItem
from shunter.engine.config import SloSpec, default_step_target_s
from shunter.engine.sim.metrics import RequestRecord, Summary, summarize
from shunter.engine.sim.report import LABEL
from shunter.engine.sim.runner import SimConfig, SimRun, simulate
from shunter.engine.sim.scenario import get_scenario
from shunter.engine.sim.scenario_sweep import ScenarioSpec
from shunter.engine.workload.generate import synthetic_workload
from shunter.engine.workload.lengths import fixed_lengths, sharegpt_like
from shunter.engine.workload.requests import WorkloadRequest

# The SLO classes every installation starts with: interactive 1,000 ms TTFT / 50 ms TBT,
# batch 60,000 ms / 500 ms (migrations/platform/0002_seed_slo_classes.py), with
# SloClass's default VLT weights.
INTERACTIVE = SloSpec("interactive", ttft_s=1.0, tbt_s=0.05)
BATCH = SloSpec("batch", ttft_s=60.0, tbt_s=0.5)

AGGRESSOR_RATE_FACTOR = 10
# Long prompts: the median prompt of Azure's 2023 coding trace, 1,469 tokens, and its
# median output, 13 tokens (workload.py's "azure-code" percentiles, from
# Azure/AzurePublicDataset AzureLLMInferenceTrace_code.csv), nine times the victim's
# ShareGPT-like mean prompt (161 tokens). Fixed, not drawn: every aggressor request is
# long, and one fits within each scenario's contexts (2,048 tokens for OPT) and KV floors
# (opt-30b's 2.5 GB of c2 holds about 1,800 of its tokens).
AGGRESSOR_PROMPT_TOKENS = 1469
AGGRESSOR_OUTPUT_TOKENS = 13

TARGET_TTFT_RATIO = 1.5
TARGET_ATTAINMENT = 0.95

# The names the isolation report uses, and the scenario variants they are
# (``scenario.VARIANTS``): vLLM is the variant with none of the techniques.
VARIANTS: dict[str, str] = {
    "vllm": "none",
    "lvf": "rotasched",
    "lvf+": "rotasched+",
    "oneiros": "oneiros",
    "combined": "combined",
    "combined+": "combined+",
    "lvf+shed": "rotasched+shed",
    "combined+shed": "combined+shed",
}
# What runs unless variants are named: the six (lvf+shed is an option).
DEFAULT_VARIANTS = ("vllm", "lvf", "lvf+", "oneiros", "combined", "combined+")


@dataclass(frozen=True)
class Pairing:
    """Which of a scenario's models serves the victim and which the aggressor, and the
    victim's default ``rate`` (requests per second)."""

    victim: str
    aggressor: str
    rate: float


# The smaller model serves the interactive tenant, a larger one the batch tenant. Default
# rates keep the aggressor within what its share serves: alone, at ten times these rates
# (5 and 2 req/s of 1,469-token prompts, 60 s, seed 1), every aggressor request met the
# batch SLO under `none` and `combined+` (P99 TTFT 0.2 s in c1, 2.4-2.8 s in c2); c2's
# opt-30b at 3 req/s already queued (P99 TTFT 18 s). Measured with this module's
# workloads on the scenarios' GH200.
PAIRINGS: dict[str, Pairing] = {
    # opt-13b, the third model, stays idle.
    "c1": Pairing("llama-3-8b", "llama-2-13b", 0.5),
    "c2": Pairing("opt-6.7b", "opt-30b", 0.2),
}
SHARING = "spatial"


@dataclass(frozen=True)
class IsolationSpec:
    """What ``shunter bench isolation --on sim`` runs: each of ``scenarios`` (``PAIRINGS``)
    with each of ``variants`` (``VARIANTS``), ``duration_s`` seconds of arrivals seeded by
    ``seed``, the victim at ``rate`` requests per second (None: the pairing's).
    ``step_target_s`` is the step target (``SchedulerConfig.step_target_s``): by default
    the one an engine serving these two classes runs with (``default_step_target_s``,
    25 ms); None runs the simulator's fixed token budget alone."""

    scenarios: tuple[str, ...] = tuple(PAIRINGS)
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    rate: float | None = None
    duration_s: float = 120.0
    seed: int = 0
    step_target_s: float | None = default_step_target_s([INTERACTIVE, BATCH])

    def __post_init__(self) -> None:
        unknown = [s for s in self.scenarios if s not in PAIRINGS]
        unknown += [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ValueError(
                f"unknown {', '.join(unknown)}: scenarios are {', '.join(PAIRINGS)}, "
                f"variants {', '.join(VARIANTS)}"
            )
        if self.rate is not None and not self.rate > 0:
            raise ValueError("the victim's rate must be positive")
        if not self.duration_s > 0:
            raise ValueError("the duration must be positive")
        if self.step_target_s is not None and not self.step_target_s > 0:
            raise ValueError("the step target must be positive")

    def victim_rate(self, scenario: str) -> float:
        return PAIRINGS[scenario].rate if self.rate is None else self.rate


@dataclass(frozen=True)
class Comparison:
    """One variant's run of the victim alone and beside the aggressor: the victim's
    summaries (``alone``, ``beside``, against its SLO class) and the aggressor's
    (against its own), the aggressor's ``offered`` rate (requests per second)."""

    variant: str
    alone: Summary
    beside: Summary
    aggressor: Summary
    offered: float

    @property
    def ttft_ratio(self) -> float:
        return p99_ratio(self.beside.ttft_s.p99, self.alone.ttft_s.p99)

    @property
    def tbt_ratio(self) -> float:
        return p99_ratio(self.beside.itl_s.p99, self.alone.itl_s.p99)


def p99_ratio(beside: float | None, alone: float | None) -> float:
    """``beside / alone``; NaN when either is missing or alone is zero."""
    if beside is None or alone is None or alone <= 0:
        return math.nan
    return beside / alone


def victim_workload(model: str, rate: float, duration_s: float, seed: int) -> list[WorkloadRequest]:
    """The victim's requests: Poisson arrivals, ShareGPT-like lengths (the scenarios'
    default workload)."""
    return synthetic_workload(
        rate=rate, duration_s=duration_s, model=model, seed=seed, lengths=sharegpt_like
    )


def aggressor_workload(
    model: str, victim_rate: float, duration_s: float, seed: int
) -> list[WorkloadRequest]:
    """The aggressor's requests: Poisson arrivals at ``AGGRESSOR_RATE_FACTOR`` times the
    victim's rate, every one ``AGGRESSOR_PROMPT_TOKENS`` in and ``AGGRESSOR_OUTPUT_TOKENS``
    out; seeded apart from the victim's."""
    return synthetic_workload(
        rate=AGGRESSOR_RATE_FACTOR * victim_rate,
        duration_s=duration_s,
        model=model,
        seed=seed + 1,
        lengths=fixed_lengths(AGGRESSOR_PROMPT_TOKENS, AGGRESSOR_OUTPUT_TOKENS),
    )


def isolation_config(
    scenario: str, variant: str, *, step_target_s: float | None = None
) -> SimConfig:
    """The scenario's engine for ``variant`` (``VARIANTS``) with spatial sharing, the
    victim's tenant in the interactive class and the aggressor's in the batch class,
    with ``step_target_s`` (``SchedulerConfig.step_target_s``)."""
    pairing = PAIRINGS[scenario]
    name = VARIANTS[variant]
    # The rate only shapes the scenario's own workloads, not its engine.
    config = ScenarioSpec(scenario, (SHARING,), (name,), (1.0,)).sim_config(name, SHARING)
    classes = {pairing.victim: INTERACTIVE, pairing.aggressor: BATCH}
    tenants = tuple(dataclasses.replace(t, slo=classes.get(t.model, t.slo)) for t in config.tenants)
    scheduler = dataclasses.replace(config.scheduler, step_target_s=step_target_s)
    return dataclasses.replace(config, tenants=tenants, scheduler=scheduler)


def compare(spec: IsolationSpec, scenario: str, variant: str) -> Comparison:
    """Simulate ``spec``'s victim alone and beside its aggressor in ``scenario`` under
    ``variant``."""
    pairing, rate, duration_s = PAIRINGS[scenario], spec.victim_rate(scenario), spec.duration_s
    config = isolation_config(scenario, variant, step_target_s=spec.step_target_s)
    victim = victim_workload(pairing.victim, rate, duration_s, spec.seed)
    aggressor = aggressor_workload(pairing.aggressor, rate, duration_s, spec.seed)
    alone = simulate(config, victim)
    beside = simulate(config, victim + aggressor)
    return Comparison(
        variant,
        alone=_summary(alone, pairing.victim, INTERACTIVE, duration_s),
        beside=_summary(beside, pairing.victim, INTERACTIVE, duration_s),
        aggressor=_summary(beside, pairing.aggressor, BATCH, duration_s),
        offered=AGGRESSOR_RATE_FACTOR * rate,
    )


def _summary(run: SimRun, model: str, slo: SloSpec, duration_s: float) -> Summary:
    """``model``'s requests of ``run`` (``served_summary``, over ``duration_s`` at least)."""
    records = [r for r, m in zip(run.records, run.record_models, strict=True) if m == model]
    return served_summary(records, slo, min_duration_s=duration_s)


def served_summary(
    records: Sequence[RequestRecord],
    slo: SloSpec,
    *,
    t_start: float = 0.0,
    min_duration_s: float = 0.0,
) -> Summary:
    """``records`` against ``slo``, per second from ``t_start`` until their last token,
    or for ``min_duration_s`` if that is longer (a tenant that fell behind serves less
    per second than it was sent)."""
    end = max((r.t_last_token for r in records if r.t_last_token is not None), default=t_start)
    duration_s = max(end - t_start, min_duration_s, 1e-9)
    return summarize(records, ttft_slo_s=slo.ttft_s, tbt_slo_s=slo.tbt_s, duration_s=duration_s)


# -- the report, shared with the engine's run ------------------------------------------------


HEADER = (
    f"{'variant':<13} {'TTFT p99 ms alone':>17} {'beside':>7} {'ratio':>7} {'':<6} "
    f"{'TBT p99 ms alone':>16} {'beside':>7} {'ratio':>7} {'both% alone':>11} "
    f"{'beside':>7} {'':<6} {'aggressor req/s':>15} {'both%':>6}"
)


def format_row(c: Comparison) -> str:
    """``c`` under ``HEADER``: the victim's P99 TTFT and TBT in milliseconds alone and
    beside, their ratios, its joint attainment alone and beside (verdicts on the TTFT
    ratio and the attainment beside), and the aggressor's served/offered rate and its
    own joint attainment."""
    ttft_ok, attained_ok = _verdicts(c)
    return (
        f"{c.variant:<13} {_ms(c.alone.ttft_s.p99):>17} {_ms(c.beside.ttft_s.p99):>7} "
        f"{_ratio(c.ttft_ratio):>7} {ttft_ok:<6} {_ms(c.alone.itl_s.p99):>16} "
        f"{_ms(c.beside.itl_s.p99):>7} {_ratio(c.tbt_ratio):>7} "
        f"{c.alone.slo_attainment:>11.1%} {c.beside.slo_attainment:>7.1%} {attained_ok:<6} "
        f"{f'{c.aggressor.request_throughput:.2f}/{c.offered:g}':>15} "
        f"{c.aggressor.slo_attainment:>6.1%}"
    )


def figures(prefix: str, c: Comparison) -> list[BenchFigure]:
    """``{prefix}.{variant}.ttft_p99_ratio`` (target <= ``TARGET_TTFT_RATIO``) and
    ``.attainment`` (the victim's joint attainment beside the aggressor, in percent,
    target >= ``TARGET_ATTAINMENT``)."""
    return [
        BenchFigure(
            f"{prefix}.{c.variant}.ttft_p99_ratio", c.ttft_ratio, TARGET_TTFT_RATIO, "<=", "x"
        ),
        BenchFigure(
            f"{prefix}.{c.variant}.attainment",
            100 * c.beside.slo_attainment,
            100 * TARGET_ATTAINMENT,
            ">=",
            "%",
        ),
    ]


def targets_line() -> str:
    return (
        f"targets: the victim's P99 TTFT beside the aggressor <= {TARGET_TTFT_RATIO:g}x "
        f"alone; its joint attainment beside it >= {TARGET_ATTAINMENT:.0%}"
    )


def _verdicts(c: Comparison) -> tuple[str, str]:
    ttft, attained = figures("", c)
    return _verdict(ttft), _verdict(attained)


def _verdict(figure: BenchFigure) -> str:
    return "ok" if figure.meets(figure.target) else "MISSED"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.0f}"


def _ratio(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}x"


def bench_isolation_sim(spec: IsolationSpec) -> Iterator[ReportItem]:
    """For each scenario a heading and ``HEADER``, then each variant's row
    (``format_row``) and figures (``isolation.sim.{scenario}.{variant}.*``) as it
    finishes; last, the targets."""
    for scenario in spec.scenarios:
        pairing, rate = PAIRINGS[scenario], spec.victim_rate(scenario)
        models = ", ".join(f"{n} {s:.0%}" for n, s in get_scenario(scenario).shares)
        victim, aggressor = describe_slo(INTERACTIVE), describe_slo(BATCH)
        yield (
            f"{LABEL}: scenario {scenario} ({models}), {SHARING}, {spec.duration_s:g} s of "
            f"Poisson arrivals, seed {spec.seed}, {_step_target(spec.step_target_s)}: victim "
            f"{pairing.victim} ({victim}) at {rate:g} req/s, ShareGPT-like lengths; aggressor "
            f"{pairing.aggressor} ({aggressor}) at {AGGRESSOR_RATE_FACTOR * rate:g} req/s, "
            f"{AGGRESSOR_PROMPT_TOKENS} prompt and {AGGRESSOR_OUTPUT_TOKENS} output tokens"
        )
        yield HEADER
        for variant in spec.variants:
            c = compare(spec, scenario, variant)
            yield format_row(c)
            yield from figures(f"isolation.sim.{scenario}", c)
    yield targets_line()


def _step_target(seconds: float | None) -> str:
    return "no step target" if seconds is None else f"step target {1000 * seconds:g} ms"


def describe_slo(slo: SloSpec) -> str:
    """``interactive: TTFT 1 s, TBT 0.05 s``."""
    return f"{slo.name}: TTFT {slo.ttft_s:g} s, TBT {slo.tbt_s:g} s"
