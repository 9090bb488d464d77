"""Hostile client input to the gateway (``shunter web``): never a 5xx, always an OpenAI
error body, from the JSON parser (``jsonbody``), the routes and methods of the fast path
and of Django's front, and the HTTP server's own refusals (``gateway.server``)."""

from __future__ import annotations

import pytest
from django.test import AsyncClient
from hypothesis import HealthCheck, given, settings

from tests.gateway.conftest import DB, HTTPS, World, bearer, call
from tests.hostile import HOSTILE_BODIES, assert_openai_error, hostile_bodies, raw_exchange

pytestmark = [pytest.mark.slow, DB]


@pytest.fixture
def secret(world: World) -> str:
    node = world.node("hostile-node", world.engine.url)
    return world.key(world.tenant(world.deployment(node, "llama")))[1]


def raw_request(method: str, path: str, secret: str, extra: bytes = b"") -> bytes:
    """A raw HTTP/1.1 request as the TLS proxy forwards it, ``extra`` as its last header."""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    for name, value in {**HTTPS, **bearer(secret)}.items():
        head += f"{name}: {value}\r\n"
    return head.encode() + extra + b"\r\n"


def test_a_hostile_body_is_an_openai_400(world: World, secret: str) -> None:
    for name, body, word in HOSTILE_BODIES:
        for path in ("/v1/completions", "/v1/chat/completions"):
            r = call("POST", world.gateway.url + path, body, headers=bearer(secret))
            assert r.status == 400, (name, path, r.body[:300])
            error = assert_openai_error(r.status, r.body)
            assert error["type"] == "invalid_request_error" and word in error["message"], name


def test_every_gateway_path_and_method_answers_in_openai_format(world: World, secret: str) -> None:
    url, auth = world.gateway.url, bearer(secret)
    for path in ("/models/a%2Fb/v1/models", "/models/llama%2F/v1/chat/completions", "/v1"):
        r = call("GET", url + path, headers=auth)
        assert r.status == 404, (path, r.body[:300])
        assert assert_openai_error(r.status, r.body)["code"] == "unknown_url"
    r = call("PROPFIND", url + "/v1/chat/completions", headers=auth)
    assert r.status == 405 and r.headers["allow"] == "POST"
    assert_openai_error(r.status, r.body)
    for method in ("FOO", "G(T"):  # the HTTP parser refuses these before the application
        status, headers, body = raw_exchange(
            world.gateway.port, raw_request(method, "/v1/models", secret)
        )
        assert status == 400 and headers["content-type"] == "application/json"
        assert assert_openai_error(status, body)["code"] == "invalid_http_request"


async def test_the_django_front_answers_other_gateway_paths_in_openai_format() -> None:
    client = AsyncClient()
    for path in ("/models/a%2Fb/v1/models", "/v1"):
        r = await client.get(path, secure=True)
        assert r.status_code == 404, (path, r.content[:300])
        assert assert_openai_error(r.status_code, r.content)["code"] == "unknown_url"


def test_an_oversized_head_is_a_431_before_it_is_read(world: World, secret: str) -> None:
    port = world.gateway.port
    huge = b"Authorization: Bearer " + b"a" * (32 << 20) + b"\r\n"
    status, headers, body = raw_exchange(port, raw_request("GET", "/v1/models", secret, huge))
    assert status == 431 and headers["content-type"] == "application/json"
    assert assert_openai_error(status, body)["code"] == "request_header_fields_too_large"
    # Body bytes are not head bytes, even when they arrive with it.
    prompt = b'{"model": "llama", "max_tokens": 1, "prompt": "' + b"a " * 500_000 + b'"}'
    length = f"Content-Length: {len(prompt)}\r\n".encode()
    status, _, body = raw_exchange(
        port, raw_request("POST", "/v1/completions", secret, length) + prompt
    )
    assert status == 400 and "context" in assert_openai_error(status, body)["message"]
    assert call("GET", world.gateway.url + "/v1/models", headers=bearer(secret)).status == 200


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=hostile_bodies("llama"))
def test_fuzzed_bodies_never_give_a_5xx(world: World, secret: str, body: bytes) -> None:
    for path in ("/v1/completions", "/models/llama/v1/chat/completions"):
        r = call("POST", world.gateway.url + path, body, headers=bearer(secret))
        if r.status != 200:
            assert_openai_error(r.status, r.body)
