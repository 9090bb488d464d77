"""Draining, and a real ``shunter engine`` process that exits 0 on SIGTERM."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import torch

from shunter.engine.loadgen.engine_process import engine_command
from shunter.engine.server.models import ModelArg
from shunter.engine.server.serve import build_state
from shunter.engine.server.settings import EngineSettings
from tests.engine.server.conftest import ServerThread, request


def test_drain_refuses_new_requests(model_dirs: dict[str, Path]) -> None:
    settings = EngineSettings(models=(ModelArg("qwen", model_dirs["tiny-qwen2"]),), kv_tokens=4096)
    srv = ServerThread(build_state(settings, torch.device("cpu")))
    try:
        body = json.dumps({"model": "qwen", "prompt": "hi", "max_tokens": 2}).encode()
        assert request("POST", srv.url + "/v1/completions", body=body).status_code == 200
        assert request("POST", srv.url + "/admin/drain").json()["draining"] is True
        r = request("POST", srv.url + "/v1/completions", body=body)
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
        assert request("GET", srv.url + "/health").status_code == 503
    finally:
        srv.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_engine_process_serves_and_exits_zero_on_sigterm(model_dirs: dict[str, Path]) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        engine_command(
            port,
            4096,
            "--check-integrity",
            "--model",
            f"llama={model_dirs['tiny-llama']}:temporal",
            "--model",
            f"qwen={model_dirs['tiny-qwen2']}:spatial",
        ),
        env={**os.environ, "SHUNTER_ENGINE_TOKEN": "t0k"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if request("GET", url + "/health").status_code == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the engine did not come up"
            time.sleep(0.1)
        body = json.dumps({"model": "llama", "prompt": "hi", "max_tokens": 3}).encode()
        auth = {"Authorization": "Bearer t0k"}
        assert request("POST", url + "/v1/completions", body=body).status_code == 401
        r = request("POST", url + "/v1/completions", body=body, headers=auth)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3
        state = request("GET", url + "/admin/state", headers=auth).json()
        assert state["models"]["llama"]["sharing"] == "temporal"
        # A stream in flight when SIGTERM comes still completes within the grace period.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        stream = {"model": "qwen", "prompt": "hi", "max_tokens": 400, "stream": True}
        conn.request("POST", "/v1/completions", body=json.dumps(stream), headers=auth)
        reply = conn.getresponse()
        assert reply.readline().startswith(b"data: ")
        proc.send_signal(signal.SIGTERM)
        lines = [line.strip() for line in reply.read().split(b"\n") if line.strip()]
        assert lines[-1] == b"data: [DONE]"
        assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] in ("length", "stop")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
