"""The official openai SDK, sync and async, against a real server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from shunter.engine.exec.params import SamplingParams
from shunter.engine.generate.inputs import GenerateRequest
from shunter.engine.generate.run import GenerateOptions, run_generate
from tests.engine.server.conftest import TOKEN, ServerThread, assert_no_leaks

PROMPT = "The yard has a hump"


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0)


@pytest.fixture
def aclient(server: ServerThread) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0)


def test_models_lists_both(client: openai.OpenAI) -> None:
    assert sorted(m.id for m in client.models.list()) == ["llama", "qwen"]


def test_one_model_is_retrieved_by_id(client: openai.OpenAI) -> None:
    model = client.models.retrieve("qwen")
    assert model.id == "qwen" and model.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.code == "model_not_found"


def test_completion_usage_and_length(client: openai.OpenAI) -> None:
    out = client.completions.create(model="llama", prompt=PROMPT, max_tokens=5, temperature=0)
    assert out.object == "text_completion" and out.model == "llama"
    (choice,) = out.choices
    assert choice.finish_reason in ("length", "stop")
    assert out.usage is not None and out.usage.completion_tokens <= 5
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


@pytest.mark.parametrize("model", ["llama", "qwen"])
def test_greedy_token_ids_equal_shunter_generate(
    client: openai.OpenAI, model_dirs: dict[str, Path], model: str
) -> None:
    name = {"llama": "tiny-llama", "qwen": "tiny-qwen2"}[model]
    prompt_ids = [5, 17, 99, 3, 42, 7]
    out = client.completions.create(
        model=model,
        prompt=prompt_ids,
        max_tokens=12,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    served = out.choices[0].model_extra["token_ids"]  # type: ignore[index]
    expected = run_generate(
        [GenerateRequest(name, tuple(prompt_ids), None, 12, "#0")],
        GenerateOptions(
            models={name: model_dirs[name]},
            params=SamplingParams(temperature=0.0, ignore_eos=True),
            device=torch.device("cpu"),
        ),
    ).outputs[0]
    assert served == expected["output_ids"]
    assert out.choices[0].text == expected["text"]


def test_chat_n_choices_with_seed(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="qwen",
        messages=[{"role": "user", "content": "Which car goes first?"}],
        n=3,
        max_completion_tokens=6,
        temperature=1.0,
        seed=7,
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert all(c.message.role == "assistant" for c in out.choices)
    again = client.chat.completions.create(
        model="qwen",
        messages=[{"role": "user", "content": "Which car goes first?"}],
        n=3,
        max_completion_tokens=6,
        temperature=1.0,
        seed=7,
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in out.choices]


def test_stop_string_cuts_the_text(client: openai.OpenAI) -> None:
    base = client.completions.create(
        model="llama", prompt=PROMPT, max_tokens=20, temperature=0, extra_body={"ignore_eos": True}
    )
    text = base.choices[0].text
    stop = text[3:5]
    if len(stop) < 2 or not stop.strip():
        pytest.skip("greedy text too short to cut")
    cut = client.completions.create(
        model="llama",
        prompt=PROMPT,
        max_tokens=20,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True},
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]


def test_chat_stream_with_usage(client: openai.OpenAI, server: ServerThread) -> None:
    stream = client.chat.completions.create(
        model="llama",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat.completions.create(
        model="llama",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert text == whole.choices[0].message.content
    assert_no_leaks(server.wait_idle())


async def test_async_streams_and_completions(aclient: openai.AsyncOpenAI) -> None:
    async def one(i: int) -> str:
        stream = await aclient.completions.create(
            model=("llama", "qwen")[i % 2],
            prompt=PROMPT,
            max_tokens=6,
            stream=True,
            n=2,
            temperature=0.8,
            seed=i,
        )
        reasons = {}
        async for chunk in stream:
            for c in chunk.choices:
                if c.finish_reason:
                    reasons[c.index] = c.finish_reason
        assert set(reasons) == {0, 1}
        return json.dumps(reasons)

    results = await asyncio.gather(*(one(i) for i in range(6)))
    assert len(results) == 6
    chat = await aclient.chat.completions.create(
        model="qwen", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.usage is not None and chat.usage.completion_tokens <= 3
    await aclient.close()


def test_wrong_token_is_401(server: ServerThread) -> None:
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-9", prompt="x", max_tokens=1)
    assert e.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_chat_logprobs_greedy(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="llama",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    logprobs = out.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert len(logprobs.content) == 5
    for entry in logprobs.content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        # Greedy: the sampled token is the most likely one.
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)


def test_completion_logprobs_streamed_equal_whole(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": "qwen",
        "prompt": PROMPT,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": 2,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.completions.create(**kwargs).choices[0].logprobs
    assert whole is not None and whole.token_logprobs is not None
    streamed: list[float] = []
    for chunk in client.completions.create(stream=True, **kwargs):
        lp = chunk.choices[0].logprobs
        streamed += (lp.token_logprobs or []) if lp else []
    assert streamed == pytest.approx(whole.token_logprobs)
    assert whole.text_offset == sorted(whole.text_offset or [])
    # Keyed by token text: two tokens with the same text share one key.
    assert all(1 <= len(top) <= 2 for top in whole.top_logprobs or [])


def test_frequency_penalty_stops_greedy_repeats(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model="llama",
        prompt=PROMPT,
        max_tokens=24,
        temperature=0,
        frequency_penalty=2.0,
        presence_penalty=2.0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    ids = out.choices[0].model_extra["token_ids"]  # type: ignore[index]
    plain = client.completions.create(
        model="llama",
        prompt=PROMPT,
        max_tokens=24,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    plain_ids = plain.choices[0].model_extra["token_ids"]  # type: ignore[index]
    # Random weights repeat under greedy decoding; heavy penalties make repeats rarer.
    assert len(set(ids)) > len(set(plain_ids)) or len(set(ids)) == len(ids)


def test_stop_token_ids_end_a_choice_with_vllms_stop_reason(client: openai.OpenAI) -> None:
    def complete(**extra: Any) -> Any:
        return client.completions.create(
            model="llama",
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True, **extra},
        ).choices[0]

    plain = complete()
    ids = plain.model_extra["token_ids"]
    assert plain.finish_reason == "length" and plain.model_extra["stop_reason"] is None
    stopped = complete(stop_token_ids=[ids[3]])
    first = ids.index(ids[3])  # greedy: the same tokens up to the first occurrence
    assert stopped.finish_reason == "stop"
    assert stopped.model_extra["stop_reason"] == ids[3]
    assert stopped.model_extra["token_ids"] == ids[: first + 1]
    # A logit bias of +100 makes a token every greedy choice.
    biased = complete(logit_bias={str(ids[0] + 1): 100})
    assert set(biased.model_extra["token_ids"]) == {ids[0] + 1}


def test_a_stop_string_is_the_stop_reason(client: openai.OpenAI) -> None:
    plain = client.completions.create(
        model="llama", prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    ).choices[0]
    stop = plain.text[2:4]
    assert stop
    cut = client.completions.create(
        model="llama",
        prompt=PROMPT,
        max_tokens=12,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True},
    ).choices[0]
    assert cut.finish_reason == "stop" and cut.model_extra["stop_reason"] == stop
    assert stop not in cut.text


def test_best_of_returns_the_most_likely_of_its_sequences(client: openai.OpenAI) -> None:
    common: Any = dict(
        model="qwen", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=11,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    # The same seeds run the same four sequences (a choice's seed is the request's + i).
    every = client.completions.create(n=4, logprobs=0, **common)
    score = {c.text: sum(c.logprobs.token_logprobs or []) for c in every.choices if c.logprobs}
    best = client.completions.create(n=2, best_of=4, **common)
    assert [c.index for c in best.choices] == [0, 1]
    assert all(c.logprobs is None for c in best.choices)  # asked for none: shown none
    texts = [c.text for c in best.choices]
    assert texts == sorted(score, key=lambda t: -score[t])[:2]
    assert best.usage is not None and best.usage.completion_tokens == 4 * 6  # all four ran
