"""`shunter demo` end to end, as a real process on a free port with its own var dir: the
engine child, the seeded control plane, the console login, a gateway call with a seeded
key, records from the background load generator, a healthy node with a memory map, and a
clean stop on SIGTERM that leaves no child behind. And the demo's engine, as the demo
starts it, under a burst of its batch tenant: KV rotates to host memory and the idle
temporal model lends layers, as the README says."""

from __future__ import annotations

import http.cookiejar
import json
import os
import random
import re
import signal
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from shunter.engine.workload.sources import LengthDist
from shunter.engine.workload.tokens import synthetic_prompt
from shunter.project.demo import DEMO_LAYERS, LOAD, MODELS, EngineProcess, ensure_model_dirs
from tests.conftest import REPO, VENV_BIN, free_port
from tests.waiting import wait_for as wait_for_value

pytestmark = pytest.mark.slow
PASSWORD = "demo pass 4 tests"


def wait_for(url: str, proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout}s")


def console_login(base: str, username: str, password: str) -> urllib.request.OpenerDirector:
    """Log in through the console's form as a browser would; the opener keeps the session."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    form = opener.open(f"{base}/console/login/").read().decode()
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert match, form
    data = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": match.group(1), "username": username, "password": password}
    ).encode()
    request = urllib.request.Request(
        f"{base}/console/login/", data=data, headers={"Referer": f"{base}/console/login/"}
    )
    with opener.open(request) as response:
        assert response.geturl() == f"{base}/console/", response.geturl()
    return opener


def get_json(opener: urllib.request.OpenerDirector, url: str) -> Any:
    with opener.open(url, timeout=10) as response:
        return json.loads(response.read())


def child_pids(pid: int) -> set[int]:
    """The live processes whose parent is ``pid`` (Linux /proc)."""
    children = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "children").read_text().split()
        except FileNotFoundError:  # a thread that ended while we looked
            continue
        children.update(int(c) for c in text)
    return children


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_demo_brings_the_platform_up(clean_env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    env = {**clean_env, "SHUNTER_ADMIN_PASSWORD": PASSWORD}
    proc = subprocess.Popen(
        [str(VENV_BIN / "shunter"), "demo", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    var = tmp_path / "var"
    children: set[int] = set()
    try:
        wait_for(f"{base}/healthz", proc, timeout=300)
        children = child_pids(proc.pid)
        assert len(children) == 2  # the engine and the load generator

        home = urllib.request.urlopen(f"{base}/").read().decode()
        assert "embedded default" in home and "InMemoryChannelLayer" in home
        opener = console_login(base, "admin", PASSWORD)
        overview = opener.open(f"{base}/console/").read().decode()
        assert "demo-chat" in overview and "demo-batch" in overview

        keys_file = var / "demo" / "keys.json"
        assert stat.S_IMODE(keys_file.stat().st_mode) == 0o600
        # What a Prometheus beside the demo reads: the scrape token opens /metrics.
        scrape_file = var / "demo" / "metrics-token"
        assert stat.S_IMODE(scrape_file.stat().st_mode) == 0o600
        config = (var / "demo" / "prometheus.yml").read_text()
        assert f"credentials_file: {scrape_file}" in config
        (target,) = [line.split("'")[1] for line in config.splitlines() if "targets" in line]
        scrape = urllib.request.Request(
            f"http://{target}/metrics",
            headers={"Authorization": f"Bearer {scrape_file.read_text().strip()}"},
        )
        # The TTFT histogram has series once a first token came (the load generator's
        # first requests may still be on their way when the gateway is up).
        wait_for_value(
            lambda: (
                b"vllm:time_to_first_token_seconds_bucket" in urllib.request.urlopen(scrape).read()
            ),
            60,
            "a first token in the engine's /metrics",
            interval=0.5,
        )
        keys = json.loads(keys_file.read_text())
        assert set(keys) == {"demo-chat", "demo-batch"}
        chat = keys["demo-chat"]
        request = urllib.request.Request(
            f"{base}/v1/chat/completions",
            data=json.dumps(
                {
                    "model": chat["model"],
                    "messages": [{"role": "user", "content": "hello there"}],
                    "max_tokens": 8,
                }
            ).encode(),
            headers={
                "Authorization": f"Bearer {chat['key']}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            reply = json.loads(response.read())
        assert reply["model"] == "tiny-llama"
        assert reply["usage"]["completion_tokens"] >= 1

        # demo-batch's key is used by the load generator alone.
        batch = get_json(opener, f"{base}/api/tenants/?name=demo-batch")["results"][0]

        def load_records() -> list[dict[str, Any]]:
            url = f"{base}/api/records/?tenant={batch['id']}&status=ok"
            return list(get_json(opener, url)["results"])

        records = wait_for_value(load_records, 90, "a record from the load generator", interval=1)
        assert records[0]["model_name"] == "tiny-qwen2" and records[0]["stream"]
        assert records[0]["ttft_ms"] > 0

        node = get_json(opener, f"{base}/api/nodes/?name=demo")["results"][0]
        assert node["status"] == "healthy", node
        state = get_json(opener, f"{base}/api/nodes/{node['id']}/state/")["state"]
        owners = state["arena"]["pages_by_owner"]
        assert {"weights:tiny-llama", "weights:tiny-qwen2", "free"} <= set(owners)
        assert sum(owners.values()) == state["arena"]["num_pages"]
        assert {n: m["sharing"] for n, m in state["models"].items()} == {
            "tiny-llama": "temporal",
            "tiny-qwen2": "spatial",
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, output
    assert not [pid for pid in children if alive(pid)], output
    assert "admin user: admin  password: from SHUNTER_ADMIN_PASSWORD" in output
    assert f"console: {base}/console/" in output
    assert "Traceback" not in output and "Unclosed" not in output, output
    assert (var / "shunter.sqlite3").exists()
    config = json.loads((var / "models" / "tiny-llama" / "config.json").read_text())
    assert config["num_hidden_layers"] == DEMO_LAYERS


def test_demo_no_serve_prepares_and_keeps_keys(clean_env: dict[str, str], tmp_path: Path) -> None:
    command = [str(VENV_BIN / "shunter"), "demo", "--no-serve"]

    def run() -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            command, cwd=REPO, env=clean_env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    first = run()
    match = re.search(r"admin user: admin  password: (\S+)  \(shown once\)", first.stdout)
    assert match, first.stdout
    keys_file = tmp_path / "var" / "demo" / "keys.json"
    assert stat.S_IMODE(keys_file.stat().st_mode) == 0o600
    keys = json.loads(keys_file.read_text())
    assert {t: k["model"] for t, k in keys.items()} == {
        "demo-chat": "tiny-llama",
        "demo-batch": "tiny-qwen2",
    }
    assert all(k["key"].startswith("sk-shunter-") for k in keys.values())

    second = run()
    assert match.group(1) not in second.stdout
    assert "exists; set SHUNTER_ADMIN_PASSWORD to reset it" in second.stdout
    assert json.loads(keys_file.read_text()) == keys  # usable keys are kept

    # A lost file cannot be recovered (only digests are stored): new keys replace them.
    keys_file.unlink()
    run()
    renewed = json.loads(keys_file.read_text())
    assert set(renewed) == set(keys)
    assert all(renewed[t]["key"] != keys[t]["key"] for t in keys)


# The demo's idle temporal model, and the tenant whose bursts go to the spatial one.
(IDLE,) = (name for name, (_, sharing) in MODELS.items() if sharing == "temporal")
(BATCH,) = (s for s in LOAD if MODELS[s.model][1] == "spatial")


def burst(engine: EngineProcess, num_requests: int) -> tuple[list[int], dict[str, Any]]:
    """Send ``num_requests`` of the batch tenant's shortest requests at once, and watch
    ``/admin/state`` until they finish: the idle model's layers seen lent to the KV
    cache (the first time any were), and the transfer counters at the end."""
    rng = random.Random(0)
    auth = {"Authorization": f"Bearer {engine.token}"}
    bodies = [
        {
            "model": BATCH.model,
            "prompt": synthetic_prompt(LengthDist.parse(BATCH.prompt_words).low, rng),
            "max_tokens": LengthDist.parse(BATCH.output_tokens).low,
            "ignore_eos": True,
        }
        for _ in range(num_requests)
    ]
    statuses: list[int] = []

    def send(body: dict[str, Any]) -> None:
        request = urllib.request.Request(
            engine.url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={**auth, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            statuses.append(response.status)

    def state() -> Any:
        request = urllib.request.Request(engine.url + "/admin/state", headers=auth)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def borrowed() -> list[int]:
        model = state()["models"][IDLE]
        return [] if model["active"] else list(model["remapped_layers"])

    assert state()["transfers"]["blocks_d2h"] == 0 and not borrowed()
    threads = [threading.Thread(target=send, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    layers: list[int] = []
    while not layers and any(thread.is_alive() for thread in threads):
        layers = borrowed()
        time.sleep(0.05)
    for thread in threads:
        thread.join(timeout=120)
    assert statuses == [200] * num_requests
    return layers, state()["transfers"]


def test_a_burst_on_the_demos_engine_rotates_kv_and_borrows_the_idle_models_layers(
    tmp_path: Path,
) -> None:
    # The demo's engine as the demo starts it (arena, remapping, sharing modes), on the
    # demo's models, under a burst of its batch tenant on the spatial model while nobody
    # calls the temporal one. How many layers a model may lend rests on T_T, measured
    # once at start (the fastest of five host copies of a layer): should a loaded CPU
    # still slow every one of them too much to lend any, a start that lent nothing is
    # tried again, at most three in all. Each request needs 46 KV blocks (about 600
    # prompt tokens and 128 more), the arena has 274 free and 24 more from the 4 layers
    # of 6 pages remapping may lend: of eight, all but two fit at once, and where the
    # first ones ran fast the two took their blocks before they lagged, so nothing
    # needed rotating. Of sixteen, ten wait.
    model_dirs = ensure_model_dirs(tmp_path / "models")
    for _ in range(3):
        engine = EngineProcess.start(model_dirs, tmp_path / "engine.log")
        try:
            engine.wait_healthy()
            layers, transfers = burst(engine, 16)
        finally:
            engine.stop()
        if layers:
            break
    assert 0 < len(layers) < DEMO_LAYERS, f"no layers of the idle {IDLE} lent in a burst"
    # KV went to host memory and came back: requests were rotated, not recomputed.
    assert transfers["blocks_d2h"] > 0 and transfers["blocks_h2d"] > 0
    assert transfers["rotations"] > 0
