"""Workloads: the bundled ShareGPT sample, ShareGPT and trace files (and their errors),
synthetic lengths, and the schedules built from them."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from shunter.engine.loadgen.arrivals import ArrivalProcess
from shunter.engine.loadgen.cli import SAMPLE_SHAREGPT
from shunter.engine.loadgen.runner import build_schedule
from shunter.engine.loadgen.workload import (
    LengthDist,
    SyntheticWorkload,
    WorkloadError,
    load_sharegpt,
    load_trace,
    token_counter,
)
from shunter.engine.sim.workload import WorkloadRequest, write_trace


def write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


def convo(*turns: tuple[str, str]) -> dict[str, object]:
    return {"conversations": [{"from": f, "value": v} for f, v in turns]}


# --- ShareGPT -------------------------------------------------------------------------


def test_bundled_sample_loads() -> None:
    data = json.loads(SAMPLE_SHAREGPT.read_text())
    workload = load_sharegpt(SAMPLE_SHAREGPT)
    # Every conversation but the single-turn one has a human turn followed by a reply.
    assert len(data) == 40 and len(workload.specs) == 39
    assert len({s.prompt for s in workload.specs}) == 39
    assert workload.name == "sharegpt:sample_sharegpt.json"
    outputs = [s.output_len for s in workload.specs]
    assert min(outputs) < 20 and max(outputs) > 150  # short and long replies both


def test_first_human_turn_is_the_prompt_and_its_reply_sets_the_length(tmp_path: Path) -> None:
    reply = "Paris is the capital of France, on the Seine."
    path = write(
        tmp_path / "s.json",
        [
            convo(
                ("gpt", "Hello there, what would you like to know?"),
                ("human", "What is the capital of France?"),
                ("gpt", reply),
                ("human", "And of Italy? Please answer briefly."),
                ("gpt", "Rome is the capital of Italy."),
            ),
            convo(("human", "A question nobody answered.")),
            convo(("human", "Two human turns in a row here."), ("human", "Still no reply")),
        ],
    )
    words = load_sharegpt(path, count=lambda text: len(text.split()))
    (spec,) = words.specs
    assert spec.prompt == "What is the capital of France?"
    assert (spec.input_len, spec.output_len) == (6, len(reply.split()))
    # Without a tokenizer: about four characters per token.
    (estimated,) = load_sharegpt(path).specs
    assert estimated.output_len == round(len(reply) / 4)


def test_lengths_measured_with_the_model_tokenizer(tiny_llama: Path) -> None:
    count = token_counter(tiny_llama)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    workload = load_sharegpt(SAMPLE_SHAREGPT, count)
    for spec in workload.specs[:5]:
        assert spec.input_len == len(tok.encode(spec.prompt, add_special_tokens=False).ids)
    with pytest.raises(WorkloadError, match=r"no tokenizer\.json"):
        token_counter(tiny_llama.parent)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"conversations": []}), "JSON list of conversations, not dict"),
        (json.dumps([{"id": 1}]), "entry 0: expected an object with a 'conversations' list"),
        (json.dumps([convo(("human", "hi there")), [1, 2]]), "entry 1: expected an object"),
        (
            json.dumps([{"conversations": [{"from": "human", "value": 3}]}]),
            r"entry 0, turn 0: expected \{'from': str, 'value': str\}",
        ),
        (json.dumps([convo(("human", "Only a question."))]), "no conversation has a human turn"),
        (json.dumps([convo(("human", "hi"), ("gpt", "yo"))]), "no conversation has"),  # < 4 tokens
    ],
)
def test_bad_sharegpt_files_say_what_is_wrong(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(WorkloadError, match=message):
        load_sharegpt(path)


def test_missing_file_is_a_workload_error(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="cannot read"):
        load_sharegpt(tmp_path / "absent.json")


def test_sampling_shuffles_with_the_seed_and_cycles() -> None:
    workload = load_sharegpt(SAMPLE_SHAREGPT)
    a = workload.draw(100, random.Random(1))
    assert a == workload.draw(100, random.Random(1))
    assert a != workload.draw(100, random.Random(2))
    assert a[:39] == a[39:78] and set(a[:39]) == set(workload.specs)


# --- traces ---------------------------------------------------------------------------


def test_trace_lines_are_sorted_shifted_and_may_carry_prompts(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"t": 12.5, "prompt_tokens": 7, "output_tokens": 3}\n'
        "\n"
        '{"t": 10.0, "prompt": "Name three rivers in Africa.", "output_tokens": 9}\n'
        '{"t": 11.0, "prompt": "hello", "prompt_tokens": 40, "output_tokens": 2}\n'
    )
    workload = load_trace(path)
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
    workload = load_trace(path)
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
        load_trace(path)


def test_empty_trace_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n\n")
    with pytest.raises(WorkloadError, match="no requests"):
        load_trace(path)


# --- synthetic lengths and schedules --------------------------------------------------


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
    trace = load_trace(path)  # 3 gaps over 4 s: 0.75 req/s
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
