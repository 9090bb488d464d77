"""PUT /admin/deployments: reconfigure in place, add and remove models in the running engine."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from shunter.engine.server.models import ModelArg
from shunter.engine.server.serve import build_state
from shunter.engine.server.settings import EngineSettings
from tests.engine.server.conftest import ServerThread, assert_no_leaks, request


@pytest.fixture
def srv(model_dirs: dict[str, Path]) -> Iterator[ServerThread]:
    settings = EngineSettings(
        models=(ModelArg("llama", model_dirs["tiny-llama"], "temporal"),),
        kv_tokens=4096,
        grace_s=0.2,
    )
    server = ServerThread(build_state(settings, torch.device("cpu"), check_integrity=True))
    yield server
    server.close()


def _put(srv: ServerThread, body: Any) -> Any:
    return request("PUT", srv.url + "/admin/deployments", body=json.dumps(body).encode())


def _long_stream(
    srv: ServerThread, *, max_tokens: int, model: str = "llama"
) -> tuple[asyncio.AbstractEventLoop, asyncio.Task[bytes]]:
    """A streamed completion of ``max_tokens`` tokens (EOS ignored) from ``model``, on an
    event loop of its own, run until its first chunk has arrived: the loop and the task
    that reads the rest of the stream."""
    started = asyncio.Event()

    async def read() -> bytes:
        body = {"model": model, "prompt": "hi", "max_tokens": max_tokens, "stream": True}
        body["ignore_eos"] = True
        async with (
            aiohttp.ClientSession() as session,
            session.post(srv.url + "/v1/completions", json=body) as r,
        ):
            data = await r.content.readany()
            started.set()
            return data + await r.read()

    loop = asyncio.new_event_loop()
    task = loop.create_task(read())
    loop.run_until_complete(asyncio.wait_for(started.wait(), timeout=60))
    return loop, task


def _models(srv: ServerThread) -> list[str]:
    return sorted(m["id"] for m in request("GET", srv.url + "/v1/models").json()["data"])


def _complete(srv: ServerThread, model: str) -> int:
    body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 3}).encode()
    return request("POST", srv.url + "/v1/completions", body=body).status_code


def test_reconfigure_in_place(srv: ServerThread, model_dirs: dict[str, Path]) -> None:
    loop = srv.state.loop
    r = _put(
        srv,
        {
            "slo_classes": {"gold": {"ttft_ms": 200, "tbt_ms": 50}},
            "models": [
                {
                    "name": "llama",
                    "path": str(model_dirs["tiny-llama"]),
                    "sharing": "spatial",
                    "slo": "gold",
                },
            ],
        },
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "added": [],
        "removed": [],
        "reloaded": [],
        "reconfigured": ["llama"],
        "rebuilt": False,
    }
    assert srv.state.loop is loop
    state = request("GET", srv.url + "/admin/state").json()
    assert state["models"]["llama"]["sharing"] == "spatial"
    assert srv.state.models["llama"].arg.slo is not None
    assert srv.state.models["llama"].arg.slo.tbt_s == 0.05
    # The running scheduler took the change: llama now executes as a spatial model.
    assert state["tenancy"] == {
        "turn_holder": None,
        "temporal": [],
        "spatial": ["llama"],
        "turn_switches": 0,
    }
    assert state["models"]["llama"]["active"]
    tenant = loop.engine.core.scheduler.tenancy.tenants["llama"]
    assert tenant.slo is not None and tenant.slo.name == "gold"
    assert _complete(srv, "llama") == 200


def test_max_context_is_a_live_reconfigure(srv: ServerThread, model_dirs: dict[str, Path]) -> None:
    loop = srv.state.loop
    own = srv.state.models["llama"].spec.max_context
    state = request("GET", srv.url + "/admin/state").json()["models"]["llama"]
    # Unset limits are null, as the control plane sends them (left out).
    assert (state["kv_floor"], state["kv_ceiling"], state["max_context"]) == (None, None, None)
    model = {
        "name": "llama",
        "path": str(model_dirs["tiny-llama"]),
        "sharing": "temporal",
        "max_context": 64,
        "kv_ceiling": "1M",
    }
    r = _put(srv, {"models": [model]})
    assert r.status_code == 200, r.text
    assert r.json()["reconfigured"] == ["llama"] and not r.json()["rebuilt"]
    assert srv.state.loop is loop
    listed = request("GET", srv.url + "/v1/models").json()["data"]
    assert [m["max_model_len"] for m in listed] == [64]
    state = request("GET", srv.url + "/admin/state").json()["models"]["llama"]
    assert (state["kv_floor"], state["kv_ceiling"], state["max_context"]) == (None, 1 << 20, 64)
    body = json.dumps({"model": "llama", "prompt": [1] * 10, "max_tokens": 60}).encode()
    r = request("POST", srv.url + "/v1/completions", body=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "max_tokens"
    assert "maximum context length is 64 tokens" in error["message"] and "70" in error["message"]
    assert _complete(srv, "llama") == 200
    # Above the model's own context the model's own bound holds.
    r = _put(srv, {"models": [{**model, "max_context": own * 2}]})
    assert r.status_code == 200, r.text
    listed = request("GET", srv.url + "/v1/models").json()["data"]
    assert [m["max_model_len"] for m in listed] == [own]


def test_bounds_a_live_request_cannot_fit_are_refused(
    srv: ServerThread, model_dirs: dict[str, Path]
) -> None:
    loop, task = _long_stream(srv, max_tokens=1000)
    model = {"name": "llama", "path": str(model_dirs["tiny-llama"]), "kv_ceiling": 4096}
    r = _put(srv, {"models": [model]})
    assert r.status_code == 400 and "cannot be applied" in r.json()["error"]["message"]
    assert srv.state.settings.models[0].kv_ceiling is None
    assert loop.run_until_complete(task).rstrip().endswith(b"data: [DONE]")
    loop.close()


def test_floors_beyond_the_kv_pages_are_refused(
    srv: ServerThread, model_dirs: dict[str, Path]
) -> None:
    llama = {"name": "llama", "path": str(model_dirs["tiny-llama"]), "kv_floor": 1 << 40}
    r = _put(srv, {"models": [llama]})
    assert r.status_code == 400, r.text
    assert "floors add up to 1099511627776 bytes" in r.json()["error"]["message"]
    assert srv.state.settings.models[0].kv_floor is None
    # An added model's floor counts too.
    qwen = {"name": "qwen", "path": str(model_dirs["tiny-qwen2"]), "kv_floor": 1 << 40}
    r = _put(srv, {"models": [{**llama, "kv_floor": None}, qwen]})
    assert r.status_code == 400 and "floors add up to" in r.json()["error"]["message"], r.text
    assert _models(srv) == ["llama"] and _complete(srv, "llama") == 200


def test_add_and_remove_models(srv: ServerThread, model_dirs: dict[str, Path]) -> None:
    loop, task = _long_stream(srv, max_tokens=1500)
    r = _put(srv, {"models": [{"name": "qwen", "path": str(model_dirs["tiny-qwen2"])}]})
    assert r.status_code == 200, r.text
    assert r.json()["added"] == ["qwen"] and r.json()["removed"] == ["llama"]
    streamed = loop.run_until_complete(task)
    loop.close()
    # The removed model's stream ended with an error chunk, then [DONE].
    assert b"was removed" in streamed and streamed.rstrip().endswith(b"data: [DONE]")
    assert _models(srv) == ["qwen"]
    assert _complete(srv, "qwen") == 200
    assert _complete(srv, "llama") == 404
    assert_no_leaks(srv.wait_idle())


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"models": "x"},
        {"models": [{"name": "a", "path": "/nonexistent"}]},
        {"models": [{"name": "a"}]},
        {"models": [], "device": "cpu"},
        {"models": [{"name": "a", "path": "/x", "max_context": 0}]},
        {"models": [{"name": "a", "path": "/x", "max_context": "long"}]},
    ],
)
def test_bad_desired_sets_change_nothing(srv: ServerThread, body: Any) -> None:
    loop = srv.state.loop
    r = _put(srv, body)
    assert r.status_code == 400 and "error" in r.json()
    assert srv.state.loop is loop and _models(srv) == ["llama"]


def _broken_copy(source: Path, dest: Path) -> Path:
    """A copy of a model directory whose config and tokenizer are fine but whose weights
    file is not a safetensors file: it passes the checks and fails to load."""
    shutil.copytree(source, dest)
    (dest / "model.safetensors").write_bytes(b"not safetensors")
    return dest


@pytest.mark.expect_log("loading the added models failed")
def test_a_desired_set_that_fails_to_load_serves_the_previous_set_again(
    srv: ServerThread, model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    broken = _broken_copy(model_dirs["tiny-qwen2"], tmp_path / "qwen")
    llama = {"name": "llama", "path": str(model_dirs["tiny-llama"]), "sharing": "temporal"}
    r = _put(srv, {"models": [llama, {"name": "qwen", "path": str(broken)}]})
    assert r.status_code == 500 and "served again" in r.json()["error"]["message"]
    assert _models(srv) == ["llama"] and _complete(srv, "llama") == 200
    assert request("GET", srv.url + "/admin/state").json()["reconciling"] is False


@pytest.mark.expect_log("loading the added models failed")
def test_a_kept_model_serves_on_when_an_added_one_fails_to_load(
    model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    llama_dir = tmp_path / "llama"
    shutil.copytree(model_dirs["tiny-llama"], llama_dir)
    settings = EngineSettings(models=(ModelArg("llama", llama_dir),), grace_s=0.2)
    server = ServerThread(build_state(settings, torch.device("cpu"), check_integrity=True))
    try:
        # The served model's directory breaks under it: it is kept, not read again.
        (llama_dir / "model.safetensors").write_bytes(b"not safetensors")
        broken = _broken_copy(model_dirs["tiny-qwen2"], tmp_path / "qwen")
        llama = {"name": "llama", "path": str(llama_dir)}
        r = _put(server, {"models": [llama, {"name": "qwen", "path": str(broken)}]})
        assert r.status_code == 500 and "served again" in r.json()["error"]["message"]
        assert _models(server) == ["llama"] and _complete(server, "llama") == 200
        assert request("GET", server.url + "/admin/state").json()["reconciling"] is False
    finally:
        server.close()


def _finish_reasons(streamed: bytes) -> list[str]:
    chunks = [line[6:] for line in streamed.splitlines() if line.startswith(b"data: {")]
    return [c["finish_reason"] for chunk in chunks for c in json.loads(chunk)["choices"]]


def _live(srv: ServerThread, model: str) -> int:
    """Live requests of ``model``, after the engine's integrity check passed."""
    srv.engine_state()
    queues = srv.state.loop.engine.core.scheduler.queues
    return len(queues[model]) if model in queues else 0


def test_adding_and_removing_a_model_leaves_the_others_requests_alone(
    srv: ServerThread, model_dirs: dict[str, Path]
) -> None:
    engine_loop = srv.state.loop
    llama = {"name": "llama", "path": str(model_dirs["tiny-llama"]), "sharing": "temporal"}
    qwen = {"name": "qwen", "path": str(model_dirs["tiny-qwen2"])}
    loop, task = _long_stream(srv, max_tokens=1500)
    r = _put(srv, {"models": [llama, qwen]})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "added": ["qwen"],
        "removed": [],
        "reloaded": [],
        "reconfigured": [],
        "rebuilt": False,
    }
    assert srv.state.loop is engine_loop and _models(srv) == ["llama", "qwen"]
    assert _live(srv, "llama") == 1  # the llama stream went on through the change
    assert _complete(srv, "qwen") == 200
    qwen_loop, qwen_task = _long_stream(srv, max_tokens=1500, model="qwen")
    r = _put(srv, {"models": [llama]})
    assert r.status_code == 200, r.text
    assert r.json()["removed"] == ["qwen"] and not r.json()["rebuilt"]
    assert _live(srv, "llama") == 1
    removed = qwen_loop.run_until_complete(qwen_task)
    qwen_loop.close()
    assert b"was removed" in removed and removed.rstrip().endswith(b"data: [DONE]")
    streamed = loop.run_until_complete(task)
    loop.close()
    # The llama stream never saw the changes: it ran to its length.
    assert b"error" not in streamed and _finish_reasons(streamed)[-1] == "length"
    assert srv.state.loop is engine_loop and _models(srv) == ["llama"]
    assert _complete(srv, "qwen") == 404 and _complete(srv, "llama") == 200
    assert_no_leaks(srv.wait_idle())


def test_a_model_that_does_not_fit_is_refused_with_409_and_nothing_changes(
    model_dirs: dict[str, Path],
) -> None:
    # An arena of llama's weights and one context of it: not room for one of qwen's.
    settings = EngineSettings(
        models=(ModelArg("llama", model_dirs["tiny-llama"]),), kv_tokens=16, grace_s=0.2
    )
    server = ServerThread(build_state(settings, torch.device("cpu"), check_integrity=True))
    try:
        engine_loop = server.state.loop
        pages = server.engine_state()["arena"]
        llama = {"name": "llama", "path": str(model_dirs["tiny-llama"])}
        qwen = {"name": "qwen", "path": str(model_dirs["tiny-qwen2"])}
        r = _put(server, {"models": [llama, qwen]})
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert "'qwen' needs" in error["message"] and "bytes" in error["message"]
        assert server.state.loop is engine_loop and _models(server) == ["llama"]
        assert server.state.settings is settings
        assert server.engine_state()["arena"] == pages
        assert _complete(server, "llama") == 200
        # A shorter max_context makes room: one context of qwen is what it must fit.
        r = _put(server, {"models": [llama, {**qwen, "max_context": 64}]})
        assert r.status_code == 200 and r.json()["added"] == ["qwen"], r.text
        assert server.state.loop is engine_loop and _complete(server, "qwen") == 200
        assert_no_leaks(server.wait_idle())
    finally:
        server.close()
