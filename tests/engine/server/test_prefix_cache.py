"""Prefix caching through the server: repeated prompts hit, the counters move, and
tenants (and cache salts) never share KV unless the deployment allows it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.engine.server.conftest import TOKEN, ServerThread, assert_no_leaks, request
from tests.engine.server.test_metrics import _samples

AUTH = {"Authorization": f"Bearer {TOKEN}"}
QWEN = (("model_name", "qwen"),)
PROMPT = list(range(100, 140))  # two full blocks of 16 and a partial one


def _complete(server: ServerThread, tenant: str, **fields: object) -> dict[str, object]:
    body = {"model": "qwen", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, **fields}
    headers = {**AUTH, "X-Shunter-Tenant": tenant}
    r = request(
        "POST", server.url + "/v1/completions", body=json.dumps(body).encode(), headers=headers
    )
    assert r.status_code == 200, r.text
    reply: dict[str, object] = r.json()
    return reply


def _hits(server: ServerThread, send: dict[str, object]) -> tuple[float, float]:
    """Prefix cache (queries, hits) that one request adds."""
    before = _samples(server)
    _complete(server, **send)  # type: ignore[arg-type]
    after = _samples(server)
    return tuple(  # type: ignore[return-value]
        after[(name, QWEN)] - before.get((name, QWEN), 0.0)
        for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
    )


def test_a_repeated_prompt_hits_within_a_tenant_only(server: ServerThread) -> None:
    first = _complete(server, "prefix-a")
    assert _hits(server, {"tenant": "prefix-a"}) == (40, 32)  # the last block is computed
    assert _hits(server, {"tenant": "prefix-b"}) == (40, 0)  # another tenant's prompt
    assert _hits(server, {"tenant": "prefix-a", "cache_salt": "s1"}) == (40, 0)
    assert _hits(server, {"tenant": "prefix-a", "cache_salt": "s1"}) == (40, 32)
    again = _complete(server, "prefix-a")
    assert again["choices"] == first["choices"]  # greedy: the same tokens from cached KV
    info = [
        labels
        for (name, labels) in _samples(server)
        if name == "vllm:cache_config_info" and ("model_name", "qwen") in labels
    ]
    assert ("enable_prefix_caching", "True") in info[0]
    assert_no_leaks(server.wait_idle())


def test_an_empty_cache_salt_is_refused(server: ServerThread) -> None:
    body = {"model": "qwen", "prompt": PROMPT, "max_tokens": 2, "cache_salt": ""}
    r = request(
        "POST", server.url + "/v1/completions", body=json.dumps(body).encode(), headers=AUTH
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "cache_salt"


def test_a_model_that_shares_prefixes_serves_one_tenants_prompt_to_another(
    server: ServerThread, model_dirs: dict[str, Path]
) -> None:
    def deploy(share: bool) -> None:
        body = {
            "models": [
                {"name": "llama", "path": str(model_dirs["tiny-llama"]), "sharing": "temporal"},
                {"name": "qwen", "path": str(model_dirs["tiny-qwen2"]), "share_prefixes": share},
            ]
        }
        r = request(
            "PUT", server.url + "/admin/deployments", body=json.dumps(body).encode(), headers=AUTH
        )
        assert r.status_code == 200, r.text
        assert r.json()["rebuilt"] is False

    deploy(True)
    try:
        assert server.engine_state()["models"]["qwen"]["share_prefixes"] is True
        _complete(server, "share-a")
        assert _hits(server, {"tenant": "share-b"}) == (40, 32)
        assert _hits(server, {"tenant": "share-b", "cache_salt": "own"}) == (40, 0)
    finally:
        deploy(False)
    assert _hits(server, {"tenant": "share-c"}) == (40, 0)


def test_n_choices_of_one_prompt_compute_its_full_blocks_once(server: ServerThread) -> None:
    prompt = list(range(300, 340))  # a prompt no other test sends
    before = _samples(server)
    body = {"model": "qwen", "prompt": prompt, "max_tokens": 2, "n": 4, "temperature": 0}
    r = request(
        "POST", server.url + "/v1/completions", body=json.dumps(body).encode(), headers=AUTH
    )
    assert r.status_code == 200, r.text
    after = _samples(server)
    hits = after[("vllm:prefix_cache_hits_total", QWEN)] - before.get(
        ("vllm:prefix_cache_hits_total", QWEN), 0.0
    )
    assert hits == 3 * 32  # the three later sequences share the first one's two blocks
    assert_no_leaks(server.wait_idle())
