"""The ``openai`` SDK through the gateway with a tenant key: models, chat and completions,
streamed and not; the RequestRecord and the minute rollup of each request."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel, Field

from shunter.platform.models import Deployment
from shunter.tenants.models import Tenant, UsageRollup
from tests.gateway.conftest import DB, HTTPS, World, bearer, call, get, wait_record

pytestmark = [pytest.mark.slow, DB]


@dataclass
class Setup:
    world: World
    llama: Deployment
    qwen: Deployment
    tenant_a: Tenant
    secret_a: str
    secret_b: str

    def client(self, secret: str | None = None, base: str = "/v1") -> openai.OpenAI:
        return openai.OpenAI(
            api_key=secret or self.secret_a,
            base_url=self.world.gateway.url + base,
            default_headers=HTTPS,
            max_retries=0,
        )


@pytest.fixture
def setup(world: World) -> Setup:
    node = world.node("sdk-node", world.engine.url)
    llama = world.deployment(node, "llama", "interactive")
    qwen = world.deployment(node, "qwen", "standard")
    tenant_a, tenant_b = world.tenant(llama), world.tenant(qwen)
    _, secret_a = world.key(tenant_a)
    _, secret_b = world.key(tenant_b)
    return Setup(world, llama, qwen, tenant_a, secret_a, secret_b)


def test_each_key_lists_only_its_deployments(setup: Setup) -> None:
    assert [m.id for m in setup.client().models.list()] == ["llama"]
    assert [m.id for m in setup.client(setup.secret_b).models.list()] == ["qwen"]
    url = setup.world.gateway.url
    r = get(f"{url}/models/llama/v1/models", headers=bearer(setup.secret_a))
    assert r.status == 200 and [m["id"] for m in r.json()["data"]] == ["llama"]
    r = get(f"{url}/models/qwen/v1/models", headers=bearer(setup.secret_a))
    assert r.status == 403 and r.error["code"] == "model_not_allowed"


def test_tenant_a_cannot_use_tenant_bs_deployment(setup: Setup) -> None:
    with pytest.raises(openai.PermissionDeniedError) as e:
        setup.client().completions.create(model="qwen", prompt="hi", max_tokens=2)
    assert e.value.status_code == 403
    with pytest.raises(openai.PermissionDeniedError):
        setup.client(setup.secret_b).chat.completions.create(
            model="llama", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )


def test_chat_completion_and_its_record(setup: Setup) -> None:
    rid = f"sdk-{uuid.uuid4().hex}"
    reply = setup.client().chat.completions.create(
        model="llama",
        messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=8,
        extra_body={"ignore_eos": True},
        extra_headers={"X-Request-Id": rid},
    )
    # The engine named the completion after the request id the gateway forwarded.
    assert reply.id == f"chatcmpl-{rid}"
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    record = wait_record(rid)
    assert (record.tenant_id, record.deployment_id) == (setup.tenant_a.pk, setup.llama.pk)
    assert (record.endpoint, record.stream, record.status, record.http_status) == (
        "chat",
        False,
        "ok",
        200,
    )
    assert record.prompt_tokens == reply.usage.prompt_tokens
    assert record.completion_tokens == 8
    # A non-streamed response shows every token at once; the engine's X-Shunter-Timing
    # gives its gaps (TPOT, max ITL, so TBT is judged) and TTFT as a stream would show it.
    assert record.ttft_ms is not None and record.ttft_ms > 0
    assert record.tpot_ms is not None and record.max_itl_ms is not None
    assert 0 < record.tpot_ms <= record.max_itl_ms
    assert record.t_first_token is not None
    assert record.t_arrival < record.t_first_token < record.t_end
    e2e_ms = (record.t_end - record.t_arrival).total_seconds() * 1000
    # The seven gaps after the first token fit in what is left of the end-to-end time.
    assert record.ttft_ms + 7 * record.tpot_ms <= e2e_ms + 0.01
    assert record.ttft_met == (record.ttft_ms <= 1000)
    assert record.tbt_met == (record.tpot_ms <= 50)
    rollup = UsageRollup.objects.get(
        tenant=setup.tenant_a,
        deployment=setup.llama,
        minute=record.t_arrival.replace(second=0, microsecond=0),
    )
    assert rollup.requests >= 1 and rollup.completion_tokens >= 8


def test_streamed_chat_is_timed_per_token(setup: Setup) -> None:
    rid = f"sdk-{uuid.uuid4().hex}"
    stream = setup.client().chat.completions.create(
        model="llama",
        messages=[{"role": "user", "content": "Count with me"}],
        max_tokens=24,
        stream=True,
        extra_body={"ignore_eos": True},
        extra_headers={"X-Request-Id": rid},
    )
    chunks = list(stream)
    # The engine was asked for usage; the client was not given the usage chunk.
    assert all(chunk.choices for chunk in chunks)
    assert all(chunk.usage is None for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert stream.response.headers["x-request-id"] == rid
    assert stream.response.headers["x-accel-buffering"] == "no"
    record = wait_record(rid)
    assert (record.stream, record.status, record.completion_tokens) == (True, "ok", 24)
    assert record.prompt_tokens > 0
    assert record.ttft_ms is not None and record.tpot_ms is not None
    assert record.max_itl_ms is not None and record.t_first_token is not None
    assert 0 < record.ttft_ms < 60_000 and 0 < record.tpot_ms <= record.max_itl_ms
    e2e_ms = (record.t_end - record.t_arrival).total_seconds() * 1000
    # TPOT spreads the time after the first token over the 23 gaps.
    assert record.ttft_ms + 23 * record.tpot_ms == pytest.approx(e2e_ms, abs=50)
    assert record.t_arrival < record.t_first_token < record.t_end
    assert record.ttft_met == (record.ttft_ms <= 1000)
    assert record.tbt_met == (record.tpot_ms <= 50)


def test_streamed_usage_when_the_client_asks(setup: Setup) -> None:
    chunks = list(
        setup.client().completions.create(
            model="llama",
            prompt="Once upon a time",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5
    assert "".join(c.choices[0].text for c in chunks[:-1])


def test_the_model_path_names_the_model(setup: Setup) -> None:
    client = setup.client(base="/models/llama/v1")
    reply = client.completions.create(model="llama", prompt="hi", max_tokens=3)
    assert reply.model == "llama" and reply.usage is not None
    url = setup.world.gateway.url + "/models/llama/v1/completions"
    auth = bearer(setup.secret_a)
    r = call("POST", url, {"prompt": "hi", "max_tokens": 2}, headers=auth)
    assert r.status == 200 and r.json()["model"] == "llama"
    r = call("POST", url, {"model": "qwen", "prompt": "hi"}, headers=auth)
    assert r.status == 400 and r.error["param"] == "model"
    r = call(
        "POST",
        setup.world.gateway.url + "/models/qwen/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}]},
        headers=auth,
    )
    assert r.status == 403


class Signal(BaseModel):
    """Bounded fields, so a random-weight model's answer always closes."""

    aspect: Literal["red", "yellow", "green"]
    track: int = Field(ge=1, le=12)


def set_signal(aspect: Literal["red", "green"], track: int) -> str:
    return f"{aspect} on {track}"


class SetSignal(BaseModel):
    aspect: Literal["red", "green"]
    track: int = Field(ge=1, le=12)


def test_structured_output_and_a_tool_round_trip_through_the_gateway(setup: Setup) -> None:
    client = setup.client()
    messages: Any = [{"role": "user", "content": "Which signal?"}]
    parsed = client.beta.chat.completions.parse(
        model="llama", messages=messages, response_format=Signal, max_tokens=60, seed=1
    ).choices[0]
    assert parsed.finish_reason == "stop" and isinstance(parsed.message.parsed, Signal)
    tool = openai.pydantic_function_tool(SetSignal, name="set_signal")
    for stream in (False, True):
        if stream:
            with client.beta.chat.completions.stream(
                model="llama", messages=messages, tools=[tool], tool_choice="required",
                max_tokens=60, seed=2,
            ) as events:  # fmt: skip
                final = events.get_final_completion().choices[0]
        else:
            final = client.beta.chat.completions.parse(
                model="llama", messages=messages, tools=[tool], tool_choice="required",
                max_tokens=60, seed=2,
            ).choices[0]  # fmt: skip
        assert final.finish_reason == "tool_calls"
        (call_,) = final.message.tool_calls or []
        arguments = call_.function.parsed_arguments
        assert isinstance(arguments, SetSignal) and call_.function.name == "set_signal"
    result = set_signal(arguments.aspect, arguments.track)
    answer = client.chat.completions.create(
        model="llama",
        messages=[
            *messages,
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": call_.id, "type": "function",
                "function": {"name": call_.function.name, "arguments": call_.function.arguments},
            }]},
            {"role": "tool", "tool_call_id": call_.id, "content": result},
        ],
        tools=[tool],
        tool_choice="none",
        max_tokens=4,
    ).choices[0]  # fmt: skip
    assert answer.message.content and answer.message.tool_calls is None
