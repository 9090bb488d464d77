"""The load generator's sources: synthetic lengths and prompts, and the schedules built
from them."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path

import pytest

from shunter.engine.loadgen.arrivals import ArrivalProcess
from shunter.engine.loadgen.runner import build_schedule
from shunter.engine.workload.requests import WorkloadError
from shunter.engine.workload.sources import (
    LengthDist,
    PrefixRepetitionWorkload,
    SyntheticWorkload,
)
from shunter.engine.workload.traces import trace_workload


def test_length_specs() -> None:
    rng = random.Random(0)
    assert LengthDist.parse("128").draw(rng) == 128
    uniform = [LengthDist.parse("10..20").draw(rng) for _ in range(2000)]
    assert min(uniform) == 10 and max(uniform) == 20
    exp = [LengthDist.parse("exp:50").draw(rng) for _ in range(20000)]
    assert sum(exp) / len(exp) == pytest.approx(50, rel=0.05) and min(exp) >= 1
    for bad in ("", "ten", "20..10", "0", "exp:0", "exp:x"):
        with pytest.raises(WorkloadError):
            LengthDist.parse(bad)


def test_synthetic_prompts_have_the_drawn_length() -> None:
    workload = SyntheticWorkload(LengthDist.parse("5..9"), LengthDist.parse("16"))
    specs = workload.draw(50, random.Random(0))
    assert all(len(s.prompt.split()) == s.input_len and 5 <= s.input_len <= 9 for s in specs)
    assert {s.output_len for s in specs} == {16}
    assert len({s.prompt for s in specs}) == 50


def test_schedule_of_a_rate_and_of_a_trace(tmp_path: Path) -> None:
    synthetic = SyntheticWorkload(LengthDist.parse("4"), LengthDist.parse("4"))
    schedule = build_schedule(
        synthetic, 10.0, random.Random(0), arrival=ArrivalProcess(), num_requests=20
    )
    assert len(schedule) == 20 and [t for t, _ in schedule] == sorted(t for t, _ in schedule)
    with pytest.raises(ValueError, match="needs a request rate"):
        build_schedule(synthetic, None, random.Random(0), arrival=ArrivalProcess(), num_requests=2)

    path = tmp_path / "t.jsonl"
    rows = [{"t": t, "prompt_tokens": 4, "output_tokens": 2} for t in [0, 1, 1.5, 4]]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    trace = trace_workload(path)  # 3 gaps over 4 s: 0.75 req/s
    as_recorded = build_schedule(trace, None, random.Random(0), arrival=ArrivalProcess())
    assert [t for t, _ in as_recorded] == [0, 1, 1.5, 4]
    doubled = build_schedule(trace, 1.5, random.Random(0), arrival=ArrivalProcess())
    assert [t for t, _ in doubled] == pytest.approx([0, 0.5, 0.75, 2])
    at_once = build_schedule(trace, math.inf, random.Random(0), arrival=ArrivalProcess())
    assert [t for t, _ in at_once] == [0, 0, 0, 0]
    # Cycled: the copy starts one mean gap (4 / 3 s) after the last arrival.
    cycled = build_schedule(trace, None, random.Random(0), arrival=ArrivalProcess(), num_requests=6)
    assert [t for t, _ in cycled] == pytest.approx([0, 1, 1.5, 4, 4 + 4 / 3, 5 + 4 / 3])
    cut = build_schedule(trace, None, random.Random(0), arrival=ArrivalProcess(), duration_s=7.0)
    assert [t for t, _ in cut] == pytest.approx([0, 1, 1.5, 4, 4 + 4 / 3, 5 + 4 / 3, 5.5 + 4 / 3])


def test_prefix_repetition_shares_each_prefix_among_an_equal_share_of_requests() -> None:
    workload = PrefixRepetitionWorkload(prefix_len=6, suffix_len=3, num_prefixes=3, output_len=5)
    specs = workload.draw(12, random.Random(1))
    assert workload.draw(12, random.Random(1)) == specs
    heads = Counter(" ".join(s.prompt.split()[:6]) for s in specs)
    assert sorted(heads.values()) == [4, 4, 4]
    assert all(len(s.prompt.split()) == 9 and s.input_len == 9 for s in specs)
    assert all(s.output_len == 5 for s in specs)
    assert len({s.prompt for s in specs}) == 12  # every suffix its own
