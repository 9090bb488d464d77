"""A real server on a loopback port, in a thread of the test process, over tiny models:
``tiny-llama`` (temporal) and ``tiny-qwen2`` (spatial). Every test's logs, and its
processes', are checked for exceptions (``tests.logcheck``)."""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.engine.server.background import BackgroundServer
from shunter.engine.server.models import ModelArg
from shunter.engine.server.serve import build_state
from shunter.engine.server.settings import EngineSettings
from shunter.engine.server.state import engine_state
from tests.logcheck import log_check, pytest_configure  # noqa: F401 (the log check)

os.environ["HF_HUB_OFFLINE"] = "1"
TOKEN = "test-token"


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        name: init_model_dir(root / name, config=preset_config(name), seed=0)
        for name in ("tiny-llama", "tiny-qwen2")
    }


class ServerThread(BackgroundServer):
    """A BackgroundServer with the engine's state and integrity at hand."""

    def engine_state(self) -> dict[str, Any]:
        """The admin state, after the core's integrity check passed on the engine thread."""
        loop = self.state.loop

        def check() -> dict[str, Any]:
            loop.engine.core.check_integrity()
            return engine_state(loop, self.state.models)

        return self.run(loop.call(check))

    def wait_idle(self, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until no request is live (aborts land at the next step) and no copy is in
        flight (blocks an abort freed under a copy come back when it completes); the
        state then."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.engine_state()
            idle = state["requests"]["live"] == 0 and state["transfers"]["steps_in_flight"] == 0
            if idle or time.monotonic() > deadline:
                return state
            time.sleep(0.02)


def serve_tiny_models(model_dirs: dict[str, Path], **settings: Any) -> Iterator[ServerThread]:
    """A server of ``llama`` (tiny-llama, temporal) and ``qwen`` (tiny-qwen2, spatial)
    with the integrity check after every step, and ``settings`` (``EngineSettings``);
    closed after its fixture's last test."""
    torch.set_num_threads(1)
    engine = EngineSettings(
        models=(
            ModelArg("llama", model_dirs["tiny-llama"], "temporal"),
            ModelArg("qwen", model_dirs["tiny-qwen2"], "spatial"),
        ),
        kv_tokens=8192,
        grace_s=2.0,
        **settings,
    )
    state = build_state(engine, torch.device("cpu"), token=TOKEN, check_integrity=True)
    srv = ServerThread(state)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def server(model_dirs: dict[str, Path]) -> Iterator[ServerThread]:
    yield from serve_tiny_models(model_dirs)


def assert_no_leaks(state: dict[str, Any]) -> None:
    assert state["requests"] == {"live": 0, "streams": 0}
    for model, s in state["models"].items():
        assert s["kv_blocks_used"] == 0, model
        assert s["host_swap_blocks_used"] == 0, model
        assert s["requests"] == {"waiting": 0, "running": 0, "rotary": 0}, model
    assert state["host_swap"]["bytes_used"] == 0


class Reply:
    """A plain HTTP reply: status, headers, body."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status_code = status
        self.headers = headers
        self.content = body

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")


def request(
    method: str, url: str, *, body: bytes | None = None, headers: dict[str, str] | None = None
) -> Reply:
    """One request over a fresh loopback connection (stdlib only)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request(method, parts.path, body=body, headers=headers or {})
        r = conn.getresponse()
        return Reply(r.status, {k: v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()
