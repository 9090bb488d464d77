"""docs/operators-guide.md, run: every block marked tested, in order and as written, in one
shell against a live platform (``shunter web`` on the test database, Celery in-process so
a deployment's roll-out reaches the engine) and a ``shunter engine`` on CPU that boots on
a model the guide then replaces with its own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from tests.conftest import REPO, VENV_BIN, Process, free_port
from tests.gateway.conftest import DB, ENGINE_TOKEN, Gateway, wait_healthy

pytestmark = [pytest.mark.slow, DB]
GUIDE = REPO / "docs" / "operators-guide.md"
METRICS_TOKEN = "metrics-token-for-the-guide"
TESTED = re.compile(r"<!-- tested -->\n```sh\n(.*?)```", re.DOTALL)


def guide_blocks() -> list[str]:
    return TESTED.findall(GUIDE.read_text())


class BootEngine(Process):
    """``shunter engine`` on CPU serving a boot model until the control plane says what."""

    def __init__(self, boot: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [str(VENV_BIN / "shunter"), "engine", "--device", "cpu", "--port"]
        command += [str(self.port), "--kv-tokens", "8192", "--grace", "1"]
        command += ["--model", f"boot={boot}"]
        env = {
            **os.environ,
            "SHUNTER_ENGINE_TOKEN": ENGINE_TOKEN,
            "SHUNTER_METRICS_TOKEN": METRICS_TOKEN,
            "OMP_NUM_THREADS": "1",
        }
        super().__init__(command, env, log)
        wait_healthy(self.url + "/health", self.proc, log)


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[tuple[Gateway, BootEngine]]:
    boot = init_model_dir(tmp_path / "boot", config=preset_config("tiny-qwen2"), seed=0)
    engine = BootEngine(boot, tmp_path / "engine.log")
    # No Redis: Celery runs each task in the web process, as the embedded default does,
    # so the roll-out a deployment starts is done when its request answers.
    web = Gateway(tmp_path / "web.log", {"REDIS_URL": "", "SHUNTER_HTTPS": "0"})
    try:
        yield web, engine
    finally:
        web.stop()
        engine.stop()


def test_the_guide_has_a_tested_block_per_task() -> None:
    blocks = guide_blocks()
    assert len(blocks) >= 12
    for call in ("/api/nodes/", "/api/models/", "/api/slo-classes/", "/api/deployments/",
                 "/api/tenants/", "/api/keys/", "/v1/chat/completions", "/api/usage/",
                 "/cordon/", "/api/benchmark-jobs/", "/metrics", "shunter model init"):  # fmt: skip
        assert any(call in b for b in blocks), call


@pytest.mark.skipif(not (shutil.which("jq") and shutil.which("curl")), reason="needs jq and curl")
def test_the_guide_runs_as_written(platform: tuple[Gateway, BootEngine], tmp_path: Path) -> None:
    web, engine = platform
    user = get_user_model().objects.create_superuser("ops", "ops@example.com", "unused-pw-1")
    token = Token.objects.create(user=user).key
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        "SHUNTER": web.url,
        "TOKEN": token,
        "MODELS": str(tmp_path / "models"),
        "ENGINE_URL": engine.url,
        "ENGINE_TOKEN": ENGINE_TOKEN,
        "METRICS_TOKEN": METRICS_TOKEN,
    }
    script = "set -euo pipefail\n" + "\n".join(guide_blocks())
    run = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 0, (
        f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}\nweb log:\n{web.output()[-3000:]}"
    )
    out = run.stdout
    assert '"architecture": "LlamaForCausalLM"' in out and "tiny-llama" in out
    assert "operator" in out and '"0 3 * * *"' in out
    assert re.search(r'^vllm:num_requests_running\{model_name="tiny-llama"\} ', out, re.M)
