"""An engine that refuses the gateway's engine token is the platform's misconfiguration,
not the tenant's: the client gets a 503 ``engine_unavailable`` (never a key error), and
the operator one warning per node in the gateway's log."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import DB, World, bearer, call, wait_record

pytestmark = [pytest.mark.slow, DB]
CHAT = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
WARNING = "the engine of node 'wrong-token-node' refused the gateway's engine token"


def test_a_refused_engine_token_is_a_503_and_one_warning(world: World) -> None:
    node = world.node("wrong-token-node", world.engine.url)
    node.set_engine_token("not-the-engines-token")
    node.save()
    _, secret = world.key(world.tenant(world.deployment(node, "llama")))
    for n in range(2):
        request_id = f"wrong-engine-token-{n}"
        r = call(
            "POST",
            world.gateway.url + "/v1/chat/completions",
            CHAT,
            headers={**bearer(secret), "X-Request-Id": request_id},
        )
        assert r.status == 503, r.body
        assert r.error["code"] == "engine_unavailable"
        assert r.error["type"] == "service_unavailable"
        assert "api key" not in r.error["message"].lower()
        assert r.headers["x-request-id"] == request_id
        record = wait_record(request_id)
        assert (record.status, record.error_type, record.http_status) == (
            "error",
            "engine_unavailable",
            503,
        )
    log = world.gateway.output()
    assert log.count(f"WARNING shunter.gateway: {WARNING}") == 1
