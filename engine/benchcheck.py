"""``shunter bench check`` (``make bench-check``): run the benchmarks of ``make bench`` and
hold each figure to the target its benchmark prints, within a stated noise margin.

Each benchmark runs in its own process, as ``make bench`` runs it, its report streamed
to this terminal; those with targets write their figures (``BenchFigure``) with
``--json``. A figure passes when it meets its target, or misses it by no more than its
noise margin, a share of the target (a 25% margin on "<= 1.5 ms" passes up to 1.875 ms).
The check fails when a figure misses by more, when an expected figure is missing, when
a figure has no margin stated here, and when a benchmark exits with an error; a
benchmark without a target must only run to the end. Margins are for a shared 2-core
host: each says why it is as wide as it is.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shunter.engine.benchfigure import BenchFigure, read_figures

# The variants that keep the victim's SLO (``bench isolation --on sim``), per scenario
# (docs/engine.md, Isolation). In c1 every one. In c2 every one but Algorithm 1's: the
# victim's peaks need more KV than its 1.03 GB floor holds, which the part of the
# aggressor's floor it cannot use gives it (lent, ``Capacity.lend_floors``) or lent
# weight memory does; `lvf` rotates the victim's requests out for the aggressor's within
# their tolerance, as Algorithm 1 does, and misses joint attainment, and so does
# `combined` (Algorithm 1 with remapping). A margin would hide these.
ISOLATING_VARIANTS = {
    "c1": ("vllm", "lvf", "lvf+", "oneiros", "combined", "combined+"),
    "c2": ("vllm", "lvf+", "oneiros", "combined+"),
}

MET, WITHIN, MISSED, MISSING, NO_MARGIN = "met", "within margin", "MISSED", "MISSING", "NO MARGIN"
PASSING = (MET, WITHIN)


def simulator_figures(lines: Sequence[str]) -> list[BenchFigure]:
    """``bench simulator``'s figures, read from its "all" line (the single-model
    policies) and its "scenario" line (a multi-model scenario): its command belongs to
    the simulator and writes no figures file."""
    figures = []
    for line in lines:
        if found := re.match(r"\s*all\s+([\d.]+) sim-s/wall-s \(target >= ([\d.]+)\)", line):
            value, target = float(found[1]), float(found[2])
            figures.append(
                BenchFigure("simulator.sim_s_per_wall_s", value, target, ">=", "sim-s/s")
            )
        scenario = r"\s*scenario .*: ([\d.]+) sim-s/wall-s \(.*target >= ([\d.]+)\)"
        if found := re.match(scenario, line):
            value, target = float(found[1]), float(found[2])
            figures.append(
                BenchFigure("simulator.scenario_sim_s_per_wall_s", value, target, ">=", "sim-s/s")
            )
    return figures


@dataclass(frozen=True)
class Bench:
    """A ``shunter bench`` command (``name`` and its ``args``): its figures' noise
    margins (figure name -> share of the target), and, for a command that writes no
    figures file, how to read them from its report lines."""

    name: str
    margins: Mapping[str, float] = field(default_factory=dict)
    parse: Callable[[Sequence[str]], list[BenchFigure]] | None = None
    args: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """The command as ``make bench`` spells it after ``shunter bench``."""
        return " ".join((self.name, *self.args))


# The benchmarks of `make bench` (scripts/bench.sh), in its order.
BENCHES: tuple[Bench, ...] = (
    Bench("scheduler"),
    Bench(
        "remap",
        {
            # Host time of a step's planning, about a millisecond: a neighbour's burst on
            # a shared core stretches a median of 60 steps by a fifth and more.
            "remap.planning_ms.default_cap": 0.25,
            "remap.planning_ms.all_running": 0.25,
        },
    ),
    # Minutes of one CPU-bound loop: slowed only by sharing the core, and smoothly.
    Bench(
        "simulator",
        {"simulator.sim_s_per_wall_s": 0.20, "simulator.scenario_sim_s_per_wall_s": 0.20},
        parse=simulator_figures,
    ),
    Bench("executor"),
    Bench("server"),
    # Ratios of medians, 0.03x against 0.3x and 0.01x against 1x when measured: only a
    # cache that stopped hitting would miss them, whatever the host's load.
    Bench(
        "prefix",
        {"prefix.docqa_ttft_p50_ratio": 0.10, "prefix.host_hit_ttft_ratio": 0.10},
    ),
    Bench("remap-exec"),
    # Ratios of medians over alternated rounds, so load slows both loops alike.
    Bench("pipeline", {"pipeline.steps_ratio": 0.10, "pipeline.hog_ratio_gain": 0.10}),
    Bench(
        "gateway",
        {
            # A ratio of medians over alternated rounds, so load slows both paths alike;
            # but client, gateway and engine share the cores, and the gateway's extra
            # process hop queues behind the others on a busy host.
            "gateway.ttft_ratio": 0.10,
            # A difference of two medians of about a millisecond, measured across three
            # processes: a quarter of the target is a few scheduler wake-ups.
            "gateway.added_itl_ms": 0.25,
        },
    ),
    # Every new request served while a replica dies is a count, not a timing: a miss is
    # a failover bug, whatever the host's load.
    Bench("gateway", {"gateway.failover_new_served": 0.001}, args=("--replicas", "2")),
    Bench(
        "loadgen",
        {
            # Poisson arrivals: the schedule's own rate differs from the nominal one by
            # sampling (a percent or two over 20 s), and the run's ends by a request.
            "loadgen.sent_rps": 0.05,
            # A P99 of timer lateness: one scheduler hiccup among 4,000 sends moves it.
            "loadgen.timing_error_p99_ms": 0.25,
        },
    ),
    # The step target that isolates: 2 ms, of the order of the quiet tenant's own step
    # on this CPU (the engine's default, 100 ms without SLO classes, is for throughput).
    Bench(
        "isolation",
        {
            # P99 of 200 quiet requests is their second-worst TTFT, against the same
            # figure alone: a single slow step on a shared core moves either side.
            "isolation.quiet_p99_ratio.long_prompt": 0.25,
            "isolation.quiet_p99_ratio.max_fanout": 0.25,
        },
        args=("--step-target-ms", "2", "--requests", "200"),
    ),
    # SIMULATED, so the same on every host and every run: a margin only for the last
    # printed digit. A change to the scheduler or the cost model that moves a figure
    # is what this check is for.
    *(
        Bench(
            "isolation",
            {
                f"isolation.sim.{scenario}.{variant}.{figure}": 0.01
                for variant in variants
                for figure in ("ttft_p99_ratio", "attainment")
            },
            args=(
                "--on",
                "sim",
                "--scenario",
                scenario,
                "--variants",
                ",".join(variants),
            ),
        )
        for scenario, variants in ISOLATING_VARIANTS.items()
    ),
)


def select(names: Sequence[str], benches: Sequence[Bench] = BENCHES) -> list[Bench]:
    """Every one of ``benches`` named in ``names`` (several commands share a name, as
    the three isolation runs do), in their own order; ValueError for a name none has."""
    known = dict.fromkeys(b.name for b in benches)
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ValueError(f"--only takes names among {', '.join(known)}")
    return [b for b in benches if b.name in names]


@dataclass(frozen=True)
class Verdict:
    """A row of the summary: what was expected under ``name``, what came (``figure``,
    None when nothing did), the margin allowed and the ``status``."""

    name: str
    figure: BenchFigure | None
    margin: float | None
    status: str

    @property
    def passed(self) -> bool:
        return self.status in PASSING


def judge(margins: Mapping[str, float], figures: Sequence[BenchFigure]) -> list[Verdict]:
    """A verdict for each figure of ``margins`` (MISSING when absent from ``figures``),
    then for each figure that has no margin (NO_MARGIN: a figure is held to a stated
    margin or the check fails)."""
    by_name = {f.name: f for f in figures}
    verdicts = []
    for name, margin in margins.items():
        figure = by_name.get(name)
        if figure is None:
            status = MISSING
        elif figure.meets(figure.target):
            status = MET
        elif figure.meets(figure.bound(margin)):
            status = WITHIN
        else:
            status = MISSED
        verdicts.append(Verdict(name, figure, margin, status))
    verdicts += [Verdict(f.name, f, None, NO_MARGIN) for f in figures if f.name not in margins]
    return verdicts


def failed_run(bench: str, returncode: int) -> Verdict:
    """The row of a benchmark that exited with ``returncode`` (not 0)."""
    return Verdict(f"{bench} (run)", None, None, f"FAILED (exit status {returncode})")


def format_table(verdicts: Sequence[Verdict]) -> list[str]:
    """The summary: figure, value, target, margin and verdict, a row each."""
    header = ("figure", "value", "target", "margin", "verdict")
    rows = [header]
    for v in verdicts:
        f = v.figure
        rows.append(
            (
                v.name,
                "-" if f is None else f"{f.value:.4g} {f.unit}",
                "-" if f is None else f"{f.direction} {f.target:g} {f.unit}",
                "-" if v.margin is None else f"{v.margin:.0%}",
                v.status,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return [
        f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:>{widths[2]}}  "
        f"{row[3]:>{widths[3]}}  {row[4]}"
        for row in rows
    ]


def shunter_command(bench: Bench, json_path: Path | None) -> list[str]:
    """``shunter bench NAME`` with its defaults, writing figures to ``json_path``."""
    command = [str(Path(sys.executable).with_name("shunter")), "bench", bench.name, *bench.args]
    return command + ([] if json_path is None else ["--json", str(json_path)])


def run_bench(
    bench: Bench, out_dir: Path, command: Callable[[Bench, Path | None], list[str]]
) -> tuple[int, list[BenchFigure]]:
    """Run ``command(bench, json_path)``, echoing its report; its exit status and the
    figures it wrote (or ``bench.parse`` read from its report)."""
    json_name = "-".join((bench.name, *bench.args)).replace("--", "")
    json_path = out_dir / f"{json_name}.json" if bench.margins and not bench.parse else None
    proc = subprocess.Popen(command(bench, json_path), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    returncode = proc.wait()
    if bench.parse is not None:
        return returncode, bench.parse(lines)
    if json_path is None or not json_path.exists():
        return returncode, []
    return returncode, read_figures(json_path)


def run_check(
    benches: Sequence[Bench] = BENCHES,
    command: Callable[[Bench, Path | None], list[str]] = shunter_command,
) -> int:
    """Run ``benches`` one after another, print the summary; 0 when every figure passed
    and every benchmark ran to the end, else 1."""
    verdicts: list[Verdict] = []
    no_target = []
    with tempfile.TemporaryDirectory(prefix="shunter-bench-check-") as tmp:
        for bench in benches:
            print(f"== {bench.label}", flush=True)
            returncode, figures = run_bench(bench, Path(tmp), command)
            verdicts += judge(bench.margins, figures)
            if returncode != 0:
                verdicts.append(failed_run(bench.label, returncode))
            elif not bench.margins:
                no_target.append(bench.label)
    print("\n== bench check: each figure against its target, within its noise margin")
    for line in format_table(verdicts):
        print(line)
    if no_target:
        print(f"ran to the end, no target: {', '.join(no_target)}")
    failed = [v.name for v in verdicts if not v.passed]
    summary = f"{len(verdicts) - len(failed)} of {len(verdicts)} passed"
    print(summary + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0
