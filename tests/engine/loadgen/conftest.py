"""Servers the load generator runs against: the SSE fixture and a real ``shunter engine``
process on ``tiny-llama``, each in its own process, as in production."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.engine.loadgen.engine_process import engine_command
from shunter.engine.loadgen.sse_fixture import fixture_process
from tests.conftest import free_port

ENGINE_TOKEN = "loadgen-test-token"
ENGINE_MODEL = "llama"


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("loadgen-models")
    return init_model_dir(root / "tiny-llama", config=preset_config("tiny-llama"), seed=0)


@pytest.fixture(scope="module")
def sse_url() -> Iterator[str]:
    """The SSE fixture: 64 tokens per response unless max_tokens says otherwise, 2 ms
    apart, model 'fixture' only, bearer token 'fx-key'."""
    with fixture_process(tokens=64, itl_ms=2.0, model="fixture", api_key="fx-key") as url:
        yield url


@pytest.fixture(scope="module")
def engine_url(tiny_llama: Path) -> Iterator[str]:
    """``shunter engine`` serving tiny-llama as 'llama' on CPU, with a bearer token."""
    port = free_port()
    proc = subprocess.Popen(
        engine_command(port, 8192, "--model", f"{ENGINE_MODEL}={tiny_llama}"),
        env={**os.environ, "SHUNTER_ENGINE_TOKEN": ENGINE_TOKEN, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, "shunter engine exited"
                assert time.monotonic() < deadline, "shunter engine did not come up"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
