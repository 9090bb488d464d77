"""Hostile client input to the engine's server: never a 5xx, always an OpenAI error body
(``jsonbody`` for bodies, the ``errors`` middleware for routes and methods), and the
request head bounded by the HTTP parser."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from shunter.engine.api.jsonbody import MAX_BODY_BYTES
from tests.engine.server.conftest import TOKEN, ServerThread, assert_no_leaks, request
from tests.hostile import (
    HOSTILE_BODIES,
    assert_openai_error,
    body_of_size,
    hostile_bodies,
    raw_exchange,
)

AUTH = {"Authorization": f"Bearer {TOKEN}"}
NOBODY = "nobody-serves-this"  # a body that is read in full is a 404 for its model


def port_of(server: ServerThread) -> int:
    return int(server.url.rsplit(":", 1)[1])


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    ("body", "word"), [c[1:] for c in HOSTILE_BODIES], ids=[c[0] for c in HOSTILE_BODIES]
)
def test_a_hostile_body_is_an_openai_400(
    server: ServerThread, path: str, body: bytes, word: str
) -> None:
    r = request("POST", server.url + path, body=body, headers=AUTH)
    assert r.status_code == 400, r.text
    error = assert_openai_error(r.status_code, r.content)
    assert error["type"] == "invalid_request_error" and word in error["message"]


def test_unknown_routes_and_methods_are_openai_errors(server: ServerThread) -> None:
    r = request("GET", server.url + "/v2/nothing", headers=AUTH)
    assert r.status_code == 404
    assert assert_openai_error(r.status_code, r.content)["code"] == "unknown_url"
    for method in ("GET", "PROPFIND", "DELETE"):
        r = request(method, server.url + "/v1/completions", headers=AUTH)
        assert r.status_code == 405 and r.headers["Allow"] == "POST"
        assert assert_openai_error(r.status_code, r.content)["code"] == "method_not_allowed"
    r = request("POST", server.url + "/v1/models", headers=AUTH)
    assert r.status_code == 405 and "GET" in r.headers["Allow"].split(",")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_body_of_the_limit_is_read_and_one_byte_more_is_a_413(
    server: ServerThread, path: str
) -> None:
    r = request("POST", server.url + path, body=body_of_size(MAX_BODY_BYTES, NOBODY), headers=AUTH)
    assert r.status_code == 404, r.text[:300]  # read and parsed: the model is unknown
    assert assert_openai_error(r.status_code, r.content)["code"] == "model_not_found"
    r = request(
        "POST", server.url + path, body=body_of_size(MAX_BODY_BYTES + 1, NOBODY), headers=AUTH
    )
    assert r.status_code == 413
    error = assert_openai_error(r.status_code, r.content)
    assert (error["code"], error["type"]) == ("request_too_large", "invalid_request_error")


def test_an_oversized_header_is_refused_before_it_is_read(server: ServerThread) -> None:
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
    status, _, _ = raw_exchange(port_of(server), head + b"a" * (32 << 20) + b"\r\n\r\n")
    assert status == 400  # the parser's refusal past 8190 bytes: the 32 MB never arrive
    assert request("GET", server.url + "/v1/models", headers=AUTH).status_code == 200


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=hostile_bodies("llama"))
def test_fuzzed_bodies_never_give_a_5xx(server: ServerThread, body: bytes) -> None:
    for path in ("/v1/completions", "/v1/chat/completions"):
        r = request("POST", server.url + path, body=body, headers=AUTH)
        if r.status_code != 200:
            assert_openai_error(r.status_code, r.content)


def test_no_request_is_left_after_the_fuzzing(server: ServerThread) -> None:
    assert_no_leaks(server.wait_idle())
