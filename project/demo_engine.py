"""The demo's engine: its two tiny models, made once under ``var/models/``, and
``shunter engine`` serving them as a child of the demo, tiny-llama temporal and tiny-qwen2
spatial, in an arena of ``HBM_BUDGET`` bytes with remapping on."""

from __future__ import annotations

import itertools
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from shunter.project.demo_children import DemoError, shunter_command, spawn, stop_child
from shunter.project.demo_paths import write_private

# The engine's arena: both demo models' weights (about 3.5 MB) and one full context of
# each (2 x 4 MiB), with a little room to spare, so that bursts of long prompts contend
# for KV blocks: they rotate KV to host memory and take layers of the idle temporal
# model (Oneiros). The node's HBM in the control plane is the same figure, so its fit
# check sees what the engine has.
HBM_BUDGET = 12 * 1024**2
# Decoder layers of the demo models: the tiny presets have two, and a model always keeps
# two layers resident, so they would have none to lend.
DEMO_LAYERS = 8
# Served name -> (preset of ``shunter model init``, sharing mode).
MODELS = {"tiny-llama": ("tiny-llama", "temporal"), "tiny-qwen2": ("tiny-qwen2", "spatial")}
ENGINE_START_S = 180.0


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _is_demo_model(path: Path) -> bool:
    """A complete model directory of the demo's depth (older demos made shallower ones)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    layers = config.get("num_hidden_layers") if isinstance(config, dict) else None
    return layers == DEMO_LAYERS and (path / "tokenizer.json").is_file()


def ensure_model_dirs(models_dir: Path) -> dict[str, Path]:
    """Served name -> directory of each demo model, made with ``shunter model init``
    (in parallel, into a temporary name renamed at the end) where missing."""
    dirs = {name: models_dir / name for name in MODELS}
    pending: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
    for name, path in dirs.items():
        if _is_demo_model(path):
            continue
        partial = models_dir / f".{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        command = shunter_command(
            "model",
            "init",
            "--preset",
            MODELS[name][0],
            "--layers",
            str(DEMO_LAYERS),
            "--out",
            str(partial),
        )
        pending.append(
            (
                name,
                partial,
                subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
            )
        )
    for name, partial, proc in pending:
        output, _ = proc.communicate()
        if proc.returncode != 0:
            raise DemoError(f"shunter model init --preset {name} failed:\n{output.decode()}")
        shutil.rmtree(dirs[name], ignore_errors=True)
        partial.rename(dirs[name])
    return dirs


@dataclass
class EngineProcess:
    """``shunter engine`` serving the demo models as a child of the demo."""

    proc: subprocess.Popen[bytes]
    url: str
    token: str
    log: Path
    metrics_token: str = ""

    @classmethod
    def start(cls, model_dirs: dict[str, Path], log: Path) -> EngineProcess:
        """Start it on a free loopback port with a fresh token (given in the
        environment, not on a command line others can read); it is not up yet."""
        port, token, scrape = free_port(), secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        command = shunter_command(
            "engine",
            "--port",
            str(port),
            "--hbm-budget",
            str(HBM_BUDGET),
            "--remap",
            "--grace",
            "2",
            *itertools.chain.from_iterable(
                ("--model", f"{name}={path}:{MODELS[name][1]}") for name, path in model_dirs.items()
            ),
        )
        env = {**os.environ, "SHUNTER_ENGINE_TOKEN": token, "SHUNTER_METRICS_TOKEN": scrape}
        proc = spawn(command, log, env=env)
        return cls(proc, f"http://127.0.0.1:{port}", token, log, scrape)

    def write_prometheus_config(self, directory: Path) -> Path:
        """Write what a Prometheus next to the demo needs to scrape the engine: the
        scrape token (``metrics-token``, mode 0600, opening ``/metrics`` alone) and a
        ``prometheus.yml`` that reads it; return the config's path."""
        token_file = directory / "metrics-token"
        write_private(token_file, self.metrics_token + "\n")
        config = directory / "prometheus.yml"
        config.write_text(
            "# Prometheus scrape config for the demo's engine (vLLM's metric names).\n"
            "scrape_configs:\n"
            "  - job_name: shunter-engine\n"
            "    scrape_interval: 5s\n"
            "    metrics_path: /metrics\n"
            "    authorization:\n"
            f"      credentials_file: {token_file}\n"
            "    static_configs:\n"
            f"      - targets: ['{self.url.removeprefix('http://')}']\n"
        )
        return config

    def wait_healthy(self, timeout_s: float = ENGINE_START_S) -> None:
        """Return once ``/health`` answers 200; DemoError (with the log's tail) if the
        engine exits or takes longer than ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise DemoError(
                    f"the engine exited with {self.proc.returncode}; {self.log}:\n{_tail(self.log)}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise DemoError(f"the engine did not answer within {timeout_s:.0f} s; {self.log}")
            time.sleep(0.25)

    def stop(self) -> None:
        stop_child(self.proc)
