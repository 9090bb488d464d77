"""JSONL traces: written and read back by the simulator, replayed by the load generator,
bad lines named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shunter.engine.workload.generate import (
    synthetic_workload,
)
from shunter.engine.workload.requests import WorkloadError, WorkloadRequest
from shunter.engine.workload.traces import read_trace, trace_workload, write_trace


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


def test_trace_lines_are_sorted_shifted_and_may_carry_prompts(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"t": 12.5, "prompt_tokens": 7, "output_tokens": 3}\n'
        "\n"
        '{"t": 10.0, "prompt": "Name three rivers in Africa.", "output_tokens": 9}\n'
        '{"t": 11.0, "prompt": "hello", "prompt_tokens": 40, "output_tokens": 2}\n'
    )
    workload = trace_workload(path)
    assert [s.t for s in workload.specs] == [0.0, 1.0, 2.5]
    first, second, third = workload.specs
    assert first.prompt == "Name three rivers in Africa." and first.output_len == 9
    assert first.input_len == round(len(first.prompt) / 4)
    assert second.input_len == 40  # a given count is kept
    assert len(third.prompt.split()) == 7 and third.input_len == 7
    assert workload.mean_rate() == pytest.approx(2 / 2.5)


def test_simulator_traces_replay(tmp_path: Path) -> None:
    path = tmp_path / "sim.jsonl"
    write_trace(path, [WorkloadRequest(0.5, 12, 4, "m"), WorkloadRequest(1.5, 6, 8, "m")])
    workload = trace_workload(path)
    assert [(s.t, s.input_len, s.output_len) for s in workload.specs] == [(0, 12, 4), (1, 6, 8)]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", r"t.jsonl:2: not valid JSON"),
        ("[1, 2]", r"t.jsonl:2: expected a JSON object"),
        ('{"prompt_tokens": 3, "output_tokens": 1}', r"t.jsonl:2: 't' must be"),
        ('{"t": -1, "prompt_tokens": 3, "output_tokens": 1}', "'t' must be a non-negative"),
        ('{"t": "soon", "prompt_tokens": 3, "output_tokens": 1}', "'t' must be"),
        ('{"t": 1, "prompt_tokens": 3}', "'output_tokens' must be a positive integer"),
        ('{"t": 1, "prompt_tokens": 0, "output_tokens": 2}', "'prompt_tokens' must be"),
        ('{"t": 1, "output_tokens": 2}', "needs 'prompt' or 'prompt_tokens'"),
        ('{"t": 1, "prompt": "", "output_tokens": 2}', "'prompt' must be a non-empty string"),
    ],
)
def test_bad_trace_lines_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"t": 0, "prompt_tokens": 3, "output_tokens": 1}\n' + line + "\n")
    with pytest.raises(WorkloadError, match=message):
        trace_workload(path)


def test_empty_trace_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n\n")
    with pytest.raises(WorkloadError, match="no requests"):
        trace_workload(path)
