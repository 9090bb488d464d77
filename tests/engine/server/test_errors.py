"""Bad requests: the right status and an OpenAI error body, and nothing left behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from shunter.engine.exec.serving import model_specs
from shunter.engine.exec.sizing import BLOCK_TOKENS
from shunter.engine.server.models import ModelArg
from shunter.engine.server.serve import build_state
from shunter.engine.server.settings import EngineSettings
from tests.engine.server.conftest import TOKEN, ServerThread, assert_no_leaks, request

AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHAT = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}]}
DONE = {"model": "llama", "prompt": "hi"}

CASES: list[tuple[str, str, Any, int, str | None]] = [
    # (name, path, body (bytes or JSON), status, param)
    ("bad json", "/v1/completions", b"{not json", 400, None),
    ("non-utf8", "/v1/completions", b'{"model": "\xff\xfe"}', 400, None),
    ("not an object", "/v1/completions", [1, 2], 400, None),
    ("no model", "/v1/completions", {"prompt": "hi"}, 400, "model"),
    ("unknown model", "/v1/completions", {**DONE, "model": "nope"}, 404, "model"),
    ("refused field", "/v1/completions", {**DONE, "echo": True}, 400, "echo"),
    ("wrong type", "/v1/completions", {**DONE, "max_tokens": "many"}, 400, "max_tokens"),
    ("negative max_tokens", "/v1/completions", {**DONE, "max_tokens": -1}, 400, "max_tokens"),
    ("huge n", "/v1/completions", {**DONE, "n": 1000}, 400, "n"),
    ("n zero", "/v1/completions", {**DONE, "n": 0}, 400, "n"),
    ("temperature", "/v1/completions", {**DONE, "temperature": 9}, 400, "temperature"),
    ("top_p zero", "/v1/completions", {**DONE, "top_p": 0}, 400, "top_p"),
    ("bool as int", "/v1/completions", {**DONE, "max_tokens": True}, 400, "max_tokens"),
    ("empty prompt", "/v1/completions", {**DONE, "prompt": ""}, 400, "prompt"),
    ("prompt list", "/v1/completions", {**DONE, "prompt": [1, "a"]}, 400, "prompt"),
    ("token id", "/v1/completions", {**DONE, "prompt": [10**9]}, 400, "prompt"),
    ("stop type", "/v1/completions", {**DONE, "stop": [1]}, 400, "stop"),
    (
        "min > max",
        "/v1/completions",
        {**DONE, "max_tokens": 2, "min_tokens": 3},
        400,
        "min_tokens",
    ),
    ("penalty", "/v1/completions", {**DONE, "presence_penalty": 3.0}, 400, "presence_penalty"),
    ("logprobs", "/v1/completions", {**DONE, "logprobs": 6}, 400, "logprobs"),
    (
        "top_logprobs alone",
        "/v1/chat/completions",
        {**CHAT, "top_logprobs": 2},
        400,
        "top_logprobs",
    ),
    ("stream_options alone", "/v1/completions", {**DONE, "stream_options": {}}, 400, None),
    ("beyond context", "/v1/completions", {**DONE, "max_tokens": 5000}, 400, "max_tokens"),
    ("empty messages", "/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    (
        "bad role",
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "x", "content": ""}]},
        400,
        "messages",
    ),
    (
        "bad content",
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user"}]},
        400,
        "messages",
    ),
    ("extra type", "/v1/completions", {**DONE, "return_token_ids": 1}, 400, "return_token_ids"),
    ("too large", "/v1/completions", b"x" * (10 << 20), 413, None),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_bad_request(
    server: ServerThread, path: str, body: Any, status: int, param: str | None
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = request("POST", server.url + path, body=data, headers=AUTH)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param
    assert r.headers.get("X-Request-Id")
    assert_no_leaks(server.engine_state())


def test_beyond_context_names_the_numbers(server: ServerThread) -> None:
    r = request(
        "POST",
        server.url + "/v1/completions",
        body=json.dumps({**DONE, "max_tokens": 5000}).encode(),
        headers=AUTH,
    )
    message = r.json()["error"]["message"]
    assert "2048" in message and "5000" in message


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_fields_are_ignored_with_a_warning(server: ServerThread, stream: bool) -> None:
    body = {**DONE, "max_tokens": 2, "temprature": 1, "stream": stream}
    r = request(
        "POST", server.url + "/v1/completions", body=json.dumps(body).encode(), headers=AUTH
    )
    assert r.status_code == 200, r.text
    assert r.headers["X-Shunter-Ignored-Parameters"] == "temprature"
    assert "temprature" in r.headers["Warning"] and r.headers["Warning"].startswith("299 ")
    plain = request(
        "POST", server.url + "/v1/completions", body=json.dumps(DONE).encode(), headers=AUTH
    )
    assert "Warning" not in plain.headers and "X-Shunter-Ignored-Parameters" not in plain.headers
    assert_no_leaks(server.engine_state())


def test_request_id_is_echoed(server: ServerThread) -> None:
    r = request(
        "POST",
        server.url + "/v1/completions",
        body=json.dumps({**DONE, "max_tokens": 2}).encode(),
        headers={**AUTH, "X-Request-Id": "abc-123"},
    )
    assert r.status_code == 200
    assert r.headers["X-Request-Id"] == "abc-123"
    assert r.json()["id"] == "cmpl-abc-123"


def test_health_needs_no_token_and_the_rest_do(server: ServerThread) -> None:
    assert request("GET", server.url + "/health").json() == {"status": "ok"}
    for path in ("/v1/models", "/metrics", "/admin/state"):
        r = request("GET", server.url + path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_unknown_route_is_an_openai_404(server: ServerThread) -> None:
    r = request("GET", server.url + "/v2/nothing", headers=AUTH)
    assert r.status_code == 404 and "error" in r.json()


def test_a_template_that_raises_is_a_400(server: ServerThread) -> None:
    served = server.state.models["qwen"]
    source = served.template_source
    served.template_source = "{{ raise_exception('system messages only') }}"
    try:
        body = json.dumps(CHAT).encode()
        r = request("POST", server.url + "/v1/chat/completions", body=body, headers=AUTH)
    finally:
        served.template_source = source
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "chat template" in message and "system messages only" in message


@pytest.mark.parametrize("header", ["bogus", "ttft_ms=fast", "tbt_ms=-5"])
def test_a_bad_slo_header_is_a_400(server: ServerThread, header: str) -> None:
    body = json.dumps({**DONE, "max_tokens": 2}).encode()
    headers = {**AUTH, "X-Shunter-Slo": header}
    r = request("POST", server.url + "/v1/completions", body=body, headers=headers)
    assert r.status_code == 400 and "X-Shunter-Slo" in r.json()["error"]["message"]
    assert_no_leaks(server.engine_state())


def test_a_request_beyond_the_models_kv_blocks_is_a_503(model_dirs: dict[str, Path]) -> None:
    # A KV ceiling of 8 blocks: within the context, beyond what the engine can ever hold.
    spec = model_specs({"llama": model_dirs["tiny-llama"]})[0]
    ceiling = 8 * spec.block_bytes(BLOCK_TOKENS)
    settings = EngineSettings(
        models=(ModelArg("llama", model_dirs["tiny-llama"], kv_ceiling=ceiling),),
        kv_tokens=4096,
    )
    server = ServerThread(build_state(settings, torch.device("cpu"), check_integrity=True))
    try:
        blocks = server.engine_state()["models"]["llama"]["kv_blocks_total"]
        assert 0 < blocks * BLOCK_TOKENS < spec.max_context
        url = server.url + "/v1/completions"
        too_long = {"model": "llama", "prompt": [1] * 10, "max_tokens": blocks * BLOCK_TOKENS}
        for stream in (False, True):
            r = request("POST", url, body=json.dumps({**too_long, "stream": stream}).encode())
            assert r.status_code == 503, r.text
            error = r.json()["error"]
            assert error["type"] == "service_unavailable"
            message = error["message"]
            assert "cannot admit" in message and f"has {blocks}" in message
            assert f"max_tokens {blocks * BLOCK_TOKENS}" in message
        assert_no_leaks(server.engine_state())
        fits = {**too_long, "max_tokens": 4}
        assert request("POST", url, body=json.dumps(fits).encode()).status_code == 200
        assert_no_leaks(server.wait_idle())
    finally:
        server.close()
