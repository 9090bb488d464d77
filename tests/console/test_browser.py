"""The console in a real browser: headless Chromium (the system's, driven by Playwright)
against the ASGI application served by uvicorn in a subprocess with DEBUG=0 and static
files collected and served by WhiteNoise, and a real engine process polled by the
control plane. Screenshots go to ``var/screenshots/``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection, connections

from shunter.platform.models import Node
from shunter.platform.services import node_poll
from tests.conftest import REPO, free_port
from tests.console.test_views import record
from tests.tenants.factories import make_deployment, make_tenant

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = REPO / "var" / "screenshots"
SHUNTER = Path(sys.executable).with_name("shunter")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, serialized_rollback=True),
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="no system Chromium at /usr/bin/chromium (Debian: apt-get install chromium)",
    ),
]


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"{url} did not come up\n{log.read_text()}"
        time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[str]:
    """A ``shunter engine`` process on CPU serving tiny-llama (temporal) and tiny-qwen2
    (spatial), after a few requests; its URL."""
    from shunter.engine.exec.model_init import init_model_dir, preset_config

    dirs = {
        name: init_model_dir(tmp_path / "models" / name, config=preset_config(name), seed=0)
        for name in ("tiny-llama", "tiny-qwen2")
    }
    port = free_port()
    log = tmp_path / "engine.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(SHUNTER),
                "engine",
                "--device=cpu",
                f"--port={port}",
                "--kv-tokens=2048",
                f"--model=llama={dirs['tiny-llama']}:temporal",
                f"--model=qwen={dirs['tiny-qwen2']}:spatial",
            ],
            env={**os.environ, "HF_HUB_OFFLINE": "1", "SHUNTER_ENGINE_TOKEN": ""},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", proc, log)
        for model in ("llama", "qwen", "llama"):
            body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 8}).encode()
            request = urllib.request.Request(
                url + "/v1/completions", body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                assert response.status == 200
        yield url
    finally:
        stop(proc)


def database_url() -> str:
    s = connection.settings_dict
    auth = quote(s["USER"]) + (f":{quote(s['PASSWORD'])}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture
def web(clean_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """The ASGI application with production settings (DEBUG=0, static files collected
    with hashed names and served by WhiteNoise) on the test database; plain HTTP on
    loopback. Its base URL."""
    env = {
        **clean_env,
        "DATABASE_URL": database_url(),
        "DEBUG": "0",
        "SHUNTER_HTTPS": "0",
        "SHUNTER_STATIC_MANIFEST": "1",
    }
    if os.environ.get("REDIS_URL"):
        env["REDIS_URL"] = os.environ["REDIS_URL"]
    subprocess.run(
        [str(SHUNTER), "manage", "collectstatic", "--noinput", "-v0"], env=env, check=True
    )
    port = free_port()
    log = tmp_path / "web.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(SHUNTER), "web", "--host=127.0.0.1", f"--port={port}", "--log-level=warning"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/healthz", proc, log)
        yield base
    finally:
        stop(proc)
        server_log = log.read_text()
        assert "Traceback" not in server_log, server_log


class Browser:
    """A page that records console errors, page errors and failed responses."""

    def __init__(self, page: Any):
        self.page = page
        self.problems: list[str] = []
        page.on(
            "console",
            lambda m: (
                self.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None
            ),
        )
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        page.on(
            "response",
            lambda r: self.problems.append(f"{r.status} {r.url}") if r.status >= 400 else None,
        )

    def shot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


@pytest.fixture
def browser() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            yield Browser(chromium.new_page(viewport={"width": 1500, "height": 1000}))
        finally:
            chromium.close()


def cell(browser: Browser, tenant_id: int, field: str) -> str:
    text = browser.page.text_content(f'tr[data-tenant="{tenant_id}"] [data-field="{field}"]')
    return (text or "").strip()


def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a database call in a thread of its own: Playwright's sync API runs an event
    loop in this one, where Django refuses synchronous queries."""

    def call() -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


@pytest.fixture
def world(engine: str, django_user_model: Any) -> dict[str, Any]:
    """A staff user, a tenant on a deployment, and a node polled from the real engine."""
    django_user_model.objects.create_user(
        username="operator", password="operator-pass-123", is_staff=True
    )
    deployment = make_deployment()
    tenant = make_tenant(deployment, name="acme")
    node = Node.objects.create(name="cpu-node", engine_url=engine, hbm_bytes=8 * 1024**3)
    assert node_poll(node=node).healthy
    node.refresh_from_db()
    assert node.state["tenancy"]["turn_holder"] in {"llama", "qwen"}
    return {"deployment": deployment, "tenant": tenant, "node": node}


def test_console_in_a_browser(world: dict[str, Any], web: str, browser: Browser) -> None:
    tenant, deployment, node = world["tenant"], world["deployment"], world["node"]
    page = browser.page
    # Anonymous: the login page; staff log in and land on the overview.
    page.goto(web + "/console/")
    assert page.url.startswith(web + "/console/login/")
    page.fill('input[name="username"]', "operator")
    page.fill('input[name="password"]', "operator-pass-123")
    page.click("section.login button[type=submit]")
    page.wait_for_url(web + "/console/")
    page.wait_for_selector("#live.on", timeout=20_000)
    assert cell(browser, tenant.pk, "w1-ttft") == "—"
    assert cell(browser, tenant.pk, "rps") == "0.00"
    page.evaluate("window.__notReloaded = true")
    browser.shot("overview-before")

    # A request finishes: the tenant's numbers change on screen, without a reload.
    in_thread(record, tenant, deployment)
    page.wait_for_function(
        f"""() => document.querySelector(
            'tr[data-tenant="{tenant.pk}"] [data-field="w1-ttft"]').textContent === "100.0%"
        """,
        timeout=20_000,
    )
    assert cell(browser, tenant.pk, "w1-joint") == "100.0%"
    assert cell(browser, tenant.pk, "rps") == "0.02"
    assert page.evaluate("window.__notReloaded") is True
    page.wait_for_function(
        "() => document.getElementById('chart-fine').data.some(t => t.y.some(v => v === 1))",
        timeout=20_000,
    )
    browser.shot("overview")

    # The node page draws the real engine's memory map.
    page.goto(f"{web}/console/nodes/{node.pk}/")
    page.wait_for_selector("#live.on", timeout=20_000)
    names = page.evaluate("document.getElementById('chart-memory').data.map(t => t.name)")
    assert {"llama weights", "qwen weights", "free", "KV swap free"} <= set(names)
    assert page.locator("#chart-memory .main-svg").count() > 0
    holder = page.text_content('[data-field="turn_holder"]')
    assert holder == node.state["tenancy"]["turn_holder"]
    assert page.locator("#models-body tr").count() == 2
    browser.shot("node")

    for name, path in (
        ("tenant", f"/console/tenants/{tenant.pk}/"),
        ("deployments", "/console/deployments/"),
        ("benchmarks", "/console/benchmarks/"),
    ):
        page.goto(web + path)
        page.wait_for_load_state("networkidle")
        browser.shot(name)
    assert page.locator("#no-benchmarks").is_visible()

    assert browser.problems == []
