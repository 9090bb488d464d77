"""Fan-out bounds and continuous usage of the engine's completions endpoints (a real
server): a request's sequences (prompts x n) are bounded, refused before any prompt is
tokenized, and a stream may carry its usage so far on every chunk."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from shunter.engine.api.protocol import MAX_SEQUENCES
from shunter.engine.server.settings import SettingsError, settings_from_dict
from tests.engine.server.conftest import TOKEN, ServerThread, request

HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def post(server: ServerThread, path: str, body: dict[str, Any]) -> Any:
    return request("POST", server.url + path, body=json.dumps(body).encode(), headers=HEADERS)


def test_a_request_of_too_many_sequences_is_refused_at_once(server: ServerThread) -> None:
    body = {"model": "qwen", "prompt": [[1, 2, 3]] * 3000, "n": 8, "max_tokens": 4}
    t0 = time.perf_counter()
    r = post(server, "/v1/completions", body)
    assert time.perf_counter() - t0 < 5  # refused, not run
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "prompt"
    assert "24000 sequences (3000 prompts x n=8)" in error["message"]
    assert f"at most {MAX_SEQUENCES}" in error["message"]
    # Prompts that fit, fanned out past the bound, name n.
    texts = ["Hello"] * 32
    r = post(server, "/v1/completions", {"model": "qwen", "prompt": texts, "n": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    assert "160 sequences (32 prompts x n=5)" in r.json()["error"]["message"]
    assert server.wait_idle()["requests"]["live"] == 0
    # At the bound it runs.
    r = post(
        server, "/v1/completions", {"model": "qwen", "prompt": [[7]] * 16, "n": 8, "max_tokens": 1}
    )
    assert r.status_code == 200 and len(r.json()["choices"]) == 128


def test_the_bound_is_an_engine_setting() -> None:
    base = {"models": [{"name": "m", "path": "/models/m"}]}
    assert settings_from_dict(base, "t").max_sequences_per_request == 128
    settings = settings_from_dict({**base, "max_sequences_per_request": 16}, "t")
    assert settings.max_sequences_per_request == 16
    with pytest.raises(SettingsError, match="max_sequences_per_request"):
        settings_from_dict({**base, "max_sequences_per_request": 0}, "t")


def events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for event in raw.split(b"\n\n"):
        if event.startswith(b"data: ") and event != b"data: [DONE]":
            out.append(json.loads(event[6:]))
    return out


@pytest.mark.parametrize("chat", [False, True])
def test_continuous_usage_counts_every_token_on_every_chunk(
    server: ServerThread, chat: bool
) -> None:
    body: dict[str, Any] = {
        "model": "llama",
        "max_tokens": 12,
        "ignore_eos": True,
        "n": 2,
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if chat:
        body["messages"] = [{"role": "user", "content": "Count with me"}]
    else:
        body["prompt"] = "Count with me"
    r = post(server, "/v1/chat/completions" if chat else "/v1/completions", body)
    assert r.status_code == 200
    chunks = events(r.content)
    *with_choices, final = chunks
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 24
    prompt = final["usage"]["prompt_tokens"]
    seen = 0
    for chunk in with_choices:
        seen += sum(len(c.get("token_ids") or []) for c in chunk["choices"])
        assert chunk["usage"] == {
            "prompt_tokens": prompt,
            "completion_tokens": seen,
            "total_tokens": prompt + seen,
        }
    assert seen == 24
    # Without the option the chunks carry no count (OpenAI's null before the last).
    body["stream_options"] = {"include_usage": True}
    r = post(server, "/v1/chat/completions" if chat else "/v1/completions", body)
    assert all(c["usage"] is None for c in events(r.content)[:-1])
