"""The gateway's request body limit (``DATA_UPLOAD_MAX_MEMORY_SIZE``) at its edge: a body
of exactly the limit is read and answered, one byte more is a 413 ``request_too_large``
in OpenAI's format, through ``shunter web``'s fast path (with a length, or chunked) and
through Django's front."""

from __future__ import annotations

import http.client
import json
from collections.abc import AsyncIterator, Iterator

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.test import AsyncClient

from shunter.engine.api.jsonbody import MAX_BODY_BYTES
from shunter.gateway.db import close_db_connections, run_db
from shunter.gateway.proxy import close_upstream
from tests.gateway.conftest import DB, HTTPS, Reply, World, bearer, call
from tests.hostile import body_of_size

pytestmark = [pytest.mark.slow, DB]
LIMIT = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
# A model nobody serves: a body that is read in full is answered 404 without an engine.
NOBODY = "nobody-serves-this"


def assert_read_in_full(status: int, raw: bytes) -> None:
    """The body was taken and parsed: the answer is about its model."""
    assert status == 404, raw[:300]
    assert json.loads(raw)["error"]["code"] == "model_not_found"


def assert_too_large(reply: Reply) -> None:
    assert reply.status == 413
    assert (reply.error["code"], reply.error["type"]) == (
        "request_too_large",
        "invalid_request_error",
    )


@pytest.fixture
def secret(world: World) -> str:
    node = world.node("limit-node", world.engine.url)
    return world.key(world.tenant(world.deployment(node, "llama")))[1]


def test_what_the_gateway_takes_an_engine_takes() -> None:
    # The body the gateway forwards grows by a few fields (usage options): it stays
    # under the engine's limit.
    assert LIMIT + 1024 <= MAX_BODY_BYTES


def test_the_fast_path_takes_a_body_of_the_limit_and_refuses_one_byte_more(
    world: World, secret: str
) -> None:
    url = world.gateway.url + "/v1/completions"
    at_limit = call("POST", url, body_of_size(LIMIT, NOBODY), headers=bearer(secret))
    assert_read_in_full(at_limit.status, at_limit.body)
    over = call("POST", url, body_of_size(LIMIT + 1, NOBODY), headers=bearer(secret))
    assert_too_large(over)
    assert over.headers["x-request-id"]


def chunks(body: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def chunked(url: str, body: bytes, secret: str) -> Reply:
    """POST ``body`` chunked: no Content-Length, the size is known only as it arrives."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    headers = {**HTTPS, **bearer(secret), "Content-Type": "application/json"}
    try:
        conn.request("POST", "/v1/completions", chunks(body), headers, encode_chunked=True)
        r = conn.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def test_a_chunked_body_is_counted_as_it_arrives(world: World, secret: str) -> None:
    at_limit = chunked(world.gateway.url, body_of_size(LIMIT, NOBODY), secret)
    assert_read_in_full(at_limit.status, at_limit.body)
    assert_too_large(chunked(world.gateway.url, body_of_size(LIMIT + 1, NOBODY), secret))


@pytest.fixture
async def client() -> AsyncIterator[AsyncClient]:
    yield AsyncClient()
    await close_upstream()
    await sync_to_async(close_db_connections)()  # the gateway's database threads


async def test_djangos_front_has_the_same_edge(client: AsyncClient, world: World) -> None:
    def setup() -> str:
        node = world.node("limit-node", world.engine.url)
        return world.key(world.tenant(world.deployment(node, "llama")))[1]

    auth = {"secure": True, "headers": bearer(await run_db(setup))}
    r = await client.post(
        "/v1/completions", body_of_size(LIMIT, NOBODY), "application/json", **auth
    )
    assert_read_in_full(r.status_code, r.content)
    r = await client.post(
        "/v1/completions", body_of_size(LIMIT + 1, NOBODY), "application/json", **auth
    )
    assert_too_large(Reply(r.status_code, {}, r.content))
