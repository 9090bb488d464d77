"""``shunter simulate --scenario``: the compared variants on one of the paper's scenarios,
at a sweep of request rates, in each sharing mode asked for; then the report.

Each result row is the core's row (``report.result_row``) plus ``scenario``,
``sharing`` and ``variant``, the remapping figures (most layers remapped at once, GB of
weights prefetched, time stalled on weights, model switches), the layers remapped over
time, and per-model P99 TTFT and TPOT, throughput and SLO attainment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shunter.engine.config import (
    CAPACITY_SOURCES,
    EngineConfig,
    RemapConfig,
    RotationConfig,
    SchedulerConfig,
    TenantSpec,
)
from shunter.engine.sim import report
from shunter.engine.sim.hardware import GB, MiB, get_profile
from shunter.engine.sim.metrics import summarize
from shunter.engine.sim.mix import mixed_workload
from shunter.engine.sim.runner import SimConfig, SimRun, simulate
from shunter.engine.sim.scenario import VARIANTS, get_scenario
from shunter.engine.sim.sweep import sweep_slo
from shunter.engine.workload.arrivals import DEFAULT_ARRIVALS, Arrivals, resolve_arrivals
from shunter.engine.workload.generate import generated_config, generated_label, lengths_from
from shunter.engine.workload.lengths import DEFAULT_WORKLOAD, get_workload
from shunter.engine.workload.requests import WorkloadRequest
from shunter.engine.workload.traces import load_trace

# A B_xfer given to a scenario is counted in SuperInfer's blocks: 16 tokens of
# Qwen2.5-32B's KV, 4 MiB. A scenario's models have blocks of other sizes: they move as
# many bytes per step.
XFER_BLOCK_BYTES = 4 * MiB


@dataclass(frozen=True)
class ScenarioSpec:
    """What ``shunter simulate --scenario`` was asked for (see its ``--help``).

    ``rates`` are requests per second per model while it receives any; ``window_s`` is
    each model's share of a temporal cycle. ``hardware`` defaults to the scenario's.
    ``xfer_budget`` is B_xfer in ``XFER_BLOCK_BYTES`` blocks; by default (None) it is
    what the link moves within a step, each step (``runner.link_xfer_blocks``).
    ``alpha``, ``beta_b`` and ``beta_f`` are the VLT's,
    ``swap_bandwidth_scale`` scales every copy bandwidth. Request lengths are
    ``workload_name``'s (``workload.WORKLOADS``), or drawn from a ``sharegpt`` file; each
    model's gaps follow ``arrivals`` (``workload.get_arrivals``; ``cv`` other than 1 is
    ``gamma:CV``). A ``trace`` (JSONL, every model named in it served here) replaces the
    generated requests at every rate and in every sharing mode. ``chunked_prefill``
    False schedules as vLLM's V0 engine (``SchedulerConfig.chunked_prefill``).
    """

    scenario: str
    sharing: tuple[str, ...]
    variants: tuple[str, ...]
    rates: tuple[float, ...]
    duration_s: float = 120.0
    window_s: float = 30.0
    hardware: str | None = None
    ttft_slo_s: float = 5.0
    tbt_slo_s: float = 0.1
    alpha: float = 3.0
    beta_b: float = 0.0
    beta_f: float = 0.5
    xfer_budget: int | None = None
    swap_bandwidth_scale: float = 1.0
    max_running: int = 256
    max_batch_tokens: int = 8192
    chunked_prefill: bool = True
    turn_quantum_s: float = 0.5
    remap_cap: float = 0.5
    capacity_order: tuple[str, ...] = CAPACITY_SOURCES
    cv: float = 1.0
    arrivals: str = DEFAULT_ARRIVALS
    workload_name: str = DEFAULT_WORKLOAD
    sharegpt: str | None = None
    trace: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ValueError(f"unknown variants {unknown}: choose from {list(VARIANTS)}")
        get_workload(self.workload_name, self.sharegpt)
        resolve_arrivals(self.arrivals, self.cv)

    @property
    def arrival_process(self) -> Arrivals:
        return resolve_arrivals(self.arrivals, self.cv)

    @property
    def hardware_name(self) -> str:
        return self.hardware or get_scenario(self.scenario).hardware

    def sim_config(self, variant: str, sharing: str) -> SimConfig:
        """The engine of ``variant`` in ``sharing`` mode: every model a tenant with its
        KV floor from the scenario."""
        scenario, v = get_scenario(self.scenario), VARIANTS[variant]
        hardware = get_profile(self.hardware_name)
        slo = sweep_slo(self)
        floors = scenario.kv_floors(hardware.hbm_bytes, EngineConfig.page_bytes)
        config = SimConfig(
            models=scenario.models,
            hardware=hardware,
            slo=slo,
            gpu_memory_utilization=scenario.memory_fraction,
            tenants=tuple(
                TenantSpec(name, sharing=sharing, slo=slo, kv_floor=floor)
                for name, floor in floors.items()
            ),
            remap=RemapConfig(
                enabled=v.remap,
                cap_fraction=self.remap_cap,
                capacity_order=self.capacity_order,
            ),
            swap_bandwidth_scale=self.swap_bandwidth_scale,
            rotation=RotationConfig(eager=v.eager_rotation),
        )
        # The engine counts B_xfer in blocks of its largest block size.
        largest = max(m.block_bytes(config.block_tokens) for m in scenario.models)
        fixed = self.xfer_budget_bytes
        scheduler = SchedulerConfig(
            policy=v.policy,
            preemption=v.preemption,
            xfer_budget_blocks=0 if fixed is None else max(1, fixed // largest),
            max_running=self.max_running,
            max_batch_tokens=self.max_batch_tokens,
            turn_quantum_s=self.turn_quantum_s,
            chunked_prefill=self.chunked_prefill,
        )
        return dataclasses.replace(config, scheduler=scheduler, xfer_budget_from_link=fixed is None)

    @property
    def xfer_budget_bytes(self) -> int | None:
        """B_xfer in bytes per step as given; None: from the link, each step."""
        return None if self.xfer_budget is None else self.xfer_budget * XFER_BLOCK_BYTES

    def workload(self, sharing: str, rate: float) -> list[WorkloadRequest]:
        """The same requests for every variant at one rate and sharing mode."""
        scenario = get_scenario(self.scenario)
        if self.trace is not None:
            return load_trace(self.trace, [name for name, _ in scenario.shares])
        loads = scenario.loads(
            sharing,
            rate,
            window_s=self.window_s,
            cv=self.arrival_process.cv,
            lengths=lengths_from(self.sharegpt, self.workload_name),
        )
        return mixed_workload(loads, duration_s=self.duration_s, seed=self.seed)

    def describe(self) -> str:
        models = ", ".join(
            f"{name} {share:.0%}" for name, share in get_scenario(self.scenario).shares
        )
        arrivals = (
            f"trace {self.trace}"
            if self.trace
            else generated_label(self.duration_s, self.workload_name, self.arrival_process)
        )
        scale = self.swap_bandwidth_scale
        swap = "" if scale == 1.0 else f", swap bandwidth x{scale:g}"
        return (
            f"scenario {self.scenario} ({models}) on {self.hardware_name}, {arrivals}, "
            f"SLO TTFT {self.ttft_slo_s:g} s / TBT {self.tbt_slo_s:g} s{swap}"
        )


COLUMNS: tuple[report.Column, ...] = (
    ("variant", "variant", "{:<9}"),
    ("sharing", "sharing", "{:<8}"),
    ("rps", "rps", "{:>6.1f}"),
    ("TTFT%", "ttft_attainment", "{:>6.1%}"),
    ("TBT%", "tbt_attainment", "{:>6.1%}"),
    ("both%", "slo_attainment", "{:>6.1%}"),
    ("TTFT p99", "p99_ttft_s", "{:>8.3f}"),
    ("TPOT p99", "p99_tpot_s", "{:>8.4f}"),
    ("tok/s", "throughput_tok_s", "{:>7.0f}"),
    ("rotations", "rotations", "{:>9d}"),
    ("layers", "max_layers_remapped", "{:>6d}"),
    ("GB pref", "gb_prefetched", "{:>8.1f}"),
    ("w-stall s", "weight_stall_s", "{:>9.2f}"),
    ("switches", "switches", "{:>8d}"),
)
MODEL_COLUMNS: tuple[report.Column, ...] = (
    ("variant", "variant", "{:<9}"),
    ("sharing", "sharing", "{:<8}"),
    ("rps", "rps", "{:>6.1f}"),
    ("model", "model", "{:<12}"),
    ("both%", "slo_attainment", "{:>6.1%}"),
    ("TTFT p99", "p99_ttft_s", "{:>8.3f}"),
    ("TPOT p99", "p99_tpot_s", "{:>8.4f}"),
    ("tok/s", "throughput_tok_s", "{:>7.0f}"),
)
PANELS: tuple[report.Panel, ...] = (
    *report.ATTAINMENT_PANELS,
    ("p99_ttft_s", "P99 TTFT", "seconds"),
    ("throughput_tok_s", "Throughput", "tokens/s"),
)


def scenario_row(
    spec: ScenarioSpec, variant: str, sharing: str, rate: float, run: SimRun
) -> report.Row:
    """One JSON result (see the module docstring)."""
    duration = max(run.sim_duration_s, spec.duration_s)
    slo = {"ttft_slo_s": spec.ttft_slo_s, "tbt_slo_s": spec.tbt_slo_s, "duration_s": duration}
    row = report.result_row(VARIANTS[variant].policy, rate, summarize(run.records, **slo), run)
    models: dict[str, dict[str, Any]] = {}
    for model in dict.fromkeys(run.record_models):
        records = [r for r, m in zip(run.records, run.record_models, strict=True) if m == model]
        s = summarize(records, **slo)
        models[model] = {
            "num_requests": s.num_requests,
            "slo_attainment": s.slo_attainment,
            "p99_ttft_s": s.ttft_s.p99,
            "p99_tpot_s": s.tpot_s.p99,
            "throughput_tok_s": s.throughput_tok_s,
        }
    return {
        "scenario": spec.scenario,
        "sharing": sharing,
        "variant": variant,
        **row,
        "max_layers_remapped": max((sum(a.values()) for _, a in run.remapped), default=0),
        "gb_prefetched": run.weight_bytes / GB,
        "weight_stall_s": run.weight_stall_s,
        "num_weight_stalls": run.num_weight_stalls,
        "switches": run.num_switches,
        "layers_remapped": [[t, alphas] for t, alphas in run.remapped],
        "models": models,
    }


def scenario_rows(spec: ScenarioSpec) -> list[report.Row]:
    """Every (sharing, rate, variant) of ``spec``, in that order: the same requests for
    every variant of a rate and sharing mode."""
    rows: list[report.Row] = []
    for sharing in spec.sharing:
        configs = {v: spec.sim_config(v, sharing) for v in spec.variants}
        for rate in spec.rates:
            workload = spec.workload(sharing, rate)
            for variant in spec.variants:
                run = simulate(configs[variant], workload)
                rows.append(scenario_row(spec, variant, sharing, rate, run))
    return rows


def run_scenarios(spec: ScenarioSpec, *, json_path: str | None, plot_path: str | None) -> int:
    """Simulate every (sharing, variant, rate), print the tables, write JSON and plot."""
    rows = scenario_rows(spec)
    order = {v: i for i, v in enumerate(spec.variants)}
    rows.sort(key=lambda r: (spec.sharing.index(r["sharing"]), order[r["variant"]], r["rps"]))
    print(report.format_table(rows, spec.describe(), COLUMNS))
    per_model = [
        {"variant": r["variant"], "sharing": r["sharing"], "rps": r["rps"], "model": m, **v}
        for r in rows
        for m, v in r["models"].items()
    ]
    print()
    print(report.format_table(per_model, "per model", MODEL_COLUMNS))
    if json_path:
        report.write_json(json_path, _config_json(spec), rows)
        print(f"{report.LABEL} results written to {json_path}")
    if plot_path:
        for sharing in spec.sharing:
            _plot(plot_path, spec, [r for r in rows if r["sharing"] == sharing], sharing)
        print(f"{report.LABEL} plot written to {plot_path}")
    return 0


def _plot(path: str, spec: ScenarioSpec, rows: Sequence[report.Row], sharing: str) -> None:
    """Attainment, P99 TTFT and throughput against rate, and the layers remapped over
    time at the highest rate; one page per sharing mode (the first at ``path``)."""
    peak = max(r["rps"] for r in rows)
    timelines = [
        (f"{r['variant']} at {peak:g} req/s", _total_layers(r["layers_remapped"]))
        for r in rows
        if r["rps"] == peak and r["layers_remapped"]
    ]
    if sharing != spec.sharing[0]:
        stem, dot, ext = path.rpartition(".")
        path = f"{stem}-{sharing}.{ext}" if dot else f"{path}-{sharing}"
    report.write_plot(
        path,
        rows,
        f"{spec.describe()}, {sharing} sharing",
        series="variant",
        panels=PANELS,
        timelines=timelines,
        timeline_title="layers remapped",
    )


def _total_layers(series: Sequence[Sequence[Any]]) -> list[tuple[float, float]]:
    return [(float(t), float(sum(alphas.values()))) for t, alphas in series]


def _config_json(spec: ScenarioSpec) -> dict[str, Any]:
    config = dataclasses.asdict(spec)
    config["hardware"] = spec.hardware_name
    config["shares"] = [list(share) for share in get_scenario(spec.scenario).shares]
    config["xfer_budget_bytes"] = spec.xfer_budget_bytes
    config.update(
        generated_config(
            spec.workload_name, spec.arrival_process, sharegpt=spec.sharegpt, trace=spec.trace
        )
    )
    if not spec.trace:
        config["workload"] += ", per-model gamma arrivals"
    return config
