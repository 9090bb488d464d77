"""The gateway's Django views (``urls.py``): the same handlers as the ASGI fast path that
``shunter web`` serves, reached through Django's request stack."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from shunter.gateway.db import close_db_connections, run_db
from shunter.gateway.proxy import close_upstream
from tests.gateway.conftest import DB, World

pytestmark = [pytest.mark.slow, DB]


@pytest.fixture
async def client() -> AsyncIterator[AsyncClient]:
    yield AsyncClient()
    # The last responses' records are written by this loop's accounting tasks: they end
    # before the test database is flushed, and the upstream session closes.
    await close_upstream()
    await sync_to_async(close_db_connections)()  # the gateway's database threads


async def test_the_django_front_answers_like_the_fast_path(
    client: AsyncClient, world: World
) -> None:
    def setup() -> str:
        node = world.node("django-node", world.engine.url)
        llama = world.deployment(node, "llama")
        world.deployment(node, "qwen")
        return world.key(world.tenant(llama))[1]

    secret = await run_db(setup)
    auth: dict[str, Any] = {
        "secure": True,
        "headers": {"Authorization": f"Bearer {secret}", "X-Request-Id": "via-django"},
    }
    r = await client.get("/v1/models", **auth)
    assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["llama"]
    assert r["X-Request-Id"] == "via-django"
    r = await client.get("/v1/models/llama", **auth)
    assert r.status_code == 200 and r.json()["id"] == "llama"
    r = await client.get("/v1/models/qwen", **auth)  # deployed, not this key's: unseen
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = await client.post("/v1/completions", "{}", "application/json", secure=True)
    assert r.status_code == 401
    qwen = json.dumps({"model": "qwen"})
    r = await client.post("/v1/completions", qwen, "application/json", **auth)
    assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"
    r = await client.get("/models/llama/v1/completions", **auth)
    assert r.status_code == 405 and r["Allow"] == "POST"
    r = await client.post("/v1/audio/speech", "{}", "application/json", **auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"

    body = json.dumps({"prompt": "Hello", "max_tokens": 3, "ignore_eos": True})
    r = await client.post("/models/llama/v1/completions", body, "application/json", **auth)
    assert r.status_code == 200, r.content
    reply = r.json()
    assert reply["model"] == "llama" and reply["usage"]["completion_tokens"] == 3

    body = json.dumps({"prompt": "Hello", "max_tokens": 4, "ignore_eos": True, "stream": True})
    r = await client.post("/models/llama/v1/completions", body, "application/json", **auth)
    assert r.status_code == 200 and r["X-Accel-Buffering"] == "no"
    events = [e async for e in r.streaming_content]
    assert b"".join(events).endswith(b"data: [DONE]\n\n")
