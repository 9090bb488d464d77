"""The docs' reproducible figures, rendered from the runs that produce them.

A doc holds each figure passage between ``<!-- figures:NAME -->`` and ``<!-- /figures -->``
on lines of their own; this module renders every passage from its run and writes it there,
so the figures are regenerated, never copied by hand. From the repository root:

    .venv/bin/python -m scripts.docs_figures           # rewrite the passages
    .venv/bin/python -m scripts.docs_figures --check   # exit 1 naming the stale ones

tests/engine/sim/test_headlines.py runs the same figures and compares them with the docs.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shunter.engine.sim.report import LABEL, Row
from shunter.engine.sim.sweep import SweepSpec, sweep_rows
from tests.engine.sched.helpers import ONE_STEP_TTFT, CappedRun, run_capped

REPO = Path(__file__).resolve().parent.parent
WIDTH = 90  # the docs' line length

# LVF against FCFS where the load outgrows the device: one rate, 30 s of arrivals, so
# that both policies take a few seconds of wall time (the test runs them too).
LVF_VS_FCFS = SweepSpec(
    model="qwen2.5-32b",
    hardware="gh200",
    policies=("lvf", "fcfs"),
    rates=(40.0,),
    duration_s=30.0,
    ttft_slo_s=5.0,
    tbt_slo_s=0.1,
    seed=0,
)


def simulate_command(spec: SweepSpec) -> str:
    """The ``shunter simulate`` command line that runs ``spec``."""
    return (
        f"shunter simulate --model {spec.model} --hardware {spec.hardware} "
        f"--policy {','.join(spec.policies)} --rps {','.join(f'{r:g}' for r in spec.rates)} "
        f"--duration {spec.duration_s:g} --ttft-slo {spec.ttft_slo_s:g} "
        f"--tbt-slo {spec.tbt_slo_s:g} --seed {spec.seed}"
    )


def _fill(text: str) -> str:
    return textwrap.fill(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def render_sweep(spec: SweepSpec, rows: Sequence[Row]) -> str:
    """A sweep's SLO attainment and rotations, per rate and policy, as a Markdown table."""
    intro = _fill(
        f"{LABEL} (`{simulate_command(spec)}`; SLO attainment, the share of requests "
        "within the TTFT target, the TBT target and both; rotations, requests moved "
        "off the device):"
    )
    table = [
        "| req/s | policy | TTFT | TBT | both | rotations |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for row in sorted(rows, key=lambda r: (r["rps"], spec.policies.index(r["policy"]))):
        table.append(
            f"| {row['rps']:g} | {row['policy']} | {row['ttft_attainment']:.1%} "
            f"| {row['tbt_attainment']:.1%} | {row['slo_attainment']:.1%} "
            f"| {row['rotations']:,} |"
        )
    return intro + "\n\n" + "\n".join(table)


def slot_turnover_runs() -> dict[str, CappedRun]:
    """The scheduler test's six short requests over two slots, with a one-step TTFT
    tolerance, under LVF and FCFS."""
    return {policy: run_capped(ONE_STEP_TTFT, policy) for policy in ("lvf", "fcfs")}


def render_slot_turnover(runs: Mapping[str, CappedRun]) -> str:
    lvf, fcfs = runs["lvf"], runs["fcfs"]
    return _fill(
        "The scheduler test's six short requests over two slots with memory for all and a "
        "one-step TTFT tolerance (`run_capped` in `tests/engine/sched/helpers.py`): "
        f"LVF {lvf.num_preempted} preemptions and {lvf.num_steps} steps, FCFS "
        f"{fcfs.num_preempted} preemptions and {fcfs.num_steps} steps."
    )


@dataclass(frozen=True)
class Figures:
    """A passage of a doc (a path from the repository root) and how to render it."""

    doc: str
    render: Callable[[], str]


FIGURES: dict[str, Figures] = {
    "lvf-slot-turnover": Figures(
        "docs/engine.md", lambda: render_slot_turnover(slot_turnover_runs())
    ),
    "lvf-vs-fcfs": Figures(
        "docs/engine.md", lambda: render_sweep(LVF_VS_FCFS, sweep_rows(LVF_VS_FCFS))
    ),
}

# A passage: its markers on lines of their own, the text between them (none when new).
_PASSAGE = re.compile(
    r"^<!-- figures:(?P<name>[\w-]+) -->\n(?:(?P<text>.*?)\n)??<!-- /figures -->$", re.M | re.S
)


def passages(text: str) -> dict[str, str]:
    """The figure passages of a doc, by name."""
    return {m["name"]: m["text"] or "" for m in _PASSAGE.finditer(text)}


def replace_passages(text: str, rendered: Mapping[str, str]) -> str:
    """``text`` with each named passage that ``rendered`` holds replaced by its text."""

    def replace(m: re.Match[str]) -> str:
        body = rendered.get(m["name"], m["text"] or "")
        return f"<!-- figures:{m['name']} -->\n{body}\n<!-- /figures -->"

    return _PASSAGE.sub(replace, text)


def stale(rendered: Mapping[str, str], root: Path = REPO) -> list[str]:
    """The names of the passages whose doc text differs from ``rendered`` (or that no
    doc holds)."""
    return [
        name
        for name, text in rendered.items()
        if passages((root / FIGURES[name].doc).read_text()).get(name) != text
    ]


def write(rendered: Mapping[str, str], root: Path = REPO) -> None:
    """Write each rendered passage into its doc; a doc that lacks its markers is an error."""
    for doc in sorted({FIGURES[name].doc for name in rendered}):
        path = root / doc
        text = path.read_text()
        missing = [n for n in rendered if FIGURES[n].doc == doc and n not in passages(text)]
        if missing:
            raise ValueError(f"{doc} has no <!-- figures:NAME --> markers for {missing}")
        path.write_text(replace_passages(text, rendered))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render the docs' figure passages.")
    parser.add_argument("--check", action="store_true", help="exit 1 if a passage is stale")
    parser.add_argument("names", nargs="*", help=f"of {', '.join(FIGURES)} (default: all)")
    ns = parser.parse_args(argv)
    unknown = [name for name in ns.names if name not in FIGURES]
    if unknown:
        parser.error(f"no figures named {', '.join(unknown)}")
    rendered = {name: FIGURES[name].render() for name in ns.names or FIGURES}
    if ns.check:
        names = stale(rendered)
        for name in names:
            print(
                f"{FIGURES[name].doc}: figures:{name} is stale; run python -m scripts.docs_figures"
            )
        return 1 if names else 0
    write(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
