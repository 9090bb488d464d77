"""ShareGPT files: the bundled sample, first exchanges as length pairs and as requests,
and the errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from shunter.engine.loadgen.cli import SAMPLE_SHAREGPT
from shunter.engine.workload.requests import WorkloadError
from shunter.engine.workload.sharegpt import sharegpt_lengths, sharegpt_workload
from shunter.engine.workload.tokens import token_counter


def write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


def convo(*turns: tuple[str, str]) -> dict[str, object]:
    return {"conversations": [{"from": f, "value": v} for f, v in turns]}


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
    assert sharegpt_lengths(path, words) == [(5, 6), (4, 5)]
    # The default estimates four characters per token.
    assert sharegpt_lengths(path)[0] == (round(len("one two three four five") / 4), 8)


def test_bundled_sample_loads() -> None:
    data = json.loads(SAMPLE_SHAREGPT.read_text())
    workload = sharegpt_workload(SAMPLE_SHAREGPT)
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
    words = sharegpt_workload(path, count=lambda text: len(text.split()))
    (spec,) = words.specs
    assert spec.prompt == "What is the capital of France?"
    assert (spec.input_len, spec.output_len) == (6, len(reply.split()))
    # Without a tokenizer: about four characters per token.
    (estimated,) = sharegpt_workload(path).specs
    assert estimated.output_len == round(len(reply) / 4)


def test_lengths_measured_with_the_model_tokenizer(tiny_llama: Path) -> None:
    count = token_counter(tiny_llama)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    workload = sharegpt_workload(SAMPLE_SHAREGPT, count)
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
        sharegpt_workload(path)


def test_missing_file_is_a_workload_error(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="cannot read"):
        sharegpt_workload(tmp_path / "absent.json")


def test_sampling_shuffles_with_the_seed_and_cycles() -> None:
    workload = sharegpt_workload(SAMPLE_SHAREGPT)
    a = workload.draw(100, random.Random(1))
    assert a == workload.draw(100, random.Random(1))
    assert a != workload.draw(100, random.Random(2))
    assert a[:39] == a[39:78] and set(a[:39]) == set(workload.specs)
