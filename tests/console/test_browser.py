"""The console in a real browser: headless Chromium (the system's, driven by Playwright)
against the ASGI application (console and gateway) served by uvicorn in a subprocess with
DEBUG=0 and static files collected and served by WhiteNoise, and a real engine process
polled by the control plane; requests go through the gateway to the engine. Screenshots
go to ``var/screenshots/``."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.platform.models import SloClass
from shunter.platform.services import deployment_create, model_create, node_poll
from shunter.tenants.services import tenant_create
from tests.conftest import REPO
from tests.console.test_benchmarks import finished_run, result, sim_job
from tests.gateway.conftest import ENGINE_TOKEN, Engine, Gateway, World, bearer, call

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = REPO / "var" / "screenshots"
SHUNTER = Path(sys.executable).with_name("shunter")
TEMPORAL = {"llama"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, serialized_rollback=True),
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="no system Chromium at /usr/bin/chromium (Debian: apt-get install chromium)",
    ),
]


def completion(url: str, model: str, secret: str) -> None:
    """One short completion, answered 200."""
    body = {"model": model, "prompt": "hello", "max_tokens": 8}
    reply = call("POST", url + "/v1/completions", body, headers=bearer(secret))
    assert reply.status == 200, reply.body


@pytest.fixture
def model_dirs(tmp_path: Path) -> dict[str, Path]:
    """Served name -> directory: ``llama`` (tiny-llama) and ``qwen`` (tiny-qwen2)."""
    presets = {"llama": "tiny-llama", "qwen": "tiny-qwen2"}
    return {
        name: init_model_dir(tmp_path / "models" / preset, config=preset_config(preset), seed=0)
        for name, preset in presets.items()
    }


@pytest.fixture
def engine(model_dirs: dict[str, Path], tmp_path: Path) -> Iterator[Engine]:
    """A ``shunter engine`` process on CPU serving ``llama`` (temporal) and ``qwen``
    (spatial), after a few requests."""
    e = Engine(model_dirs, tmp_path / "engine.log", temporal=TEMPORAL)
    try:
        for model in ("llama", "qwen", "llama"):
            completion(e.url, model, ENGINE_TOKEN)
        yield e
    finally:
        e.stop()


@pytest.fixture
def web(clean_env: dict[str, str], tmp_path: Path) -> Iterator[Gateway]:
    """The ASGI application with production settings (DEBUG=0, static files collected
    with hashed names and served by WhiteNoise) on the test database; plain HTTP on
    loopback. Its static files are collected under a var directory of its own (in the
    suite's they would switch the test process to the manifest storage)."""
    overrides = {
        "SHUNTER_VAR_DIR": clean_env["SHUNTER_VAR_DIR"],
        "DEBUG": "0",
        "SHUNTER_HTTPS": "0",
        "SHUNTER_STATIC_MANIFEST": "1",
    }
    subprocess.run(
        [str(SHUNTER), "manage", "collectstatic", "--noinput", "-v0"],
        env={**clean_env, **overrides},
        check=True,
    )
    gateway = Gateway(tmp_path / "web.log", overrides)
    try:
        yield gateway
    finally:
        gateway.stop()
        server_log = gateway.log.read_text(errors="replace")
        assert "Traceback" not in server_log, server_log[-8000:]


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
def world(
    engine: Engine, web: Gateway, model_dirs: dict[str, Path], django_user_model: Any
) -> dict[str, Any]:
    """A staff user; a node polled from the real engine, with deployments of what the
    engine serves (so that the poll finds no drift); a tenant on ``llama`` with a key (its
    secret)."""
    django_user_model.objects.create_user(
        username="operator", password="operator-pass-123", is_staff=True
    )
    rows = World(engine, web)
    node = rows.node("cpu-node", engine.url)
    deployments = {
        name: deployment_create(
            node=node,
            model=model_create(name=name, source_dir=str(path)),
            slo_class=SloClass.objects.get(name="interactive"),
            sharing="temporal" if name in TEMPORAL else "spatial",
        )
        for name, path in model_dirs.items()
    }
    tenant = rows.tenant(deployments["llama"])
    _, secret = rows.key(tenant)
    polled = node_poll(node=node)
    assert polled.healthy and (polled.reconciled is None or polled.reconciled.ok), polled
    node.refresh_from_db()
    assert node.state["tenancy"]["turn_holder"] in {"llama", "qwen"}
    return {"tenant": tenant, "node": node, "secret": secret}


def test_console_in_a_browser(world: dict[str, Any], web: Gateway, browser: Browser) -> None:
    tenant, node, base = world["tenant"], world["node"], web.url
    page = browser.page
    # Anonymous: the login page; staff log in and land on the overview.
    page.goto(base + "/console/")
    assert page.url.startswith(base + "/console/login/")
    page.fill('input[name="username"]', "operator")
    page.fill('input[name="password"]', "operator-pass-123")
    page.click("section.login button[type=submit]")
    page.wait_for_url(base + "/console/")
    page.wait_for_selector("#live.on", timeout=30_000)
    assert cell(browser, tenant.pk, "w1-ttft") == "—"
    assert cell(browser, tenant.pk, "rps") == "0.00"
    page.evaluate("window.__notReloaded = true")
    browser.shot("overview-before")

    # A request goes through the gateway to the engine: the tenant's numbers change on
    # screen, without a reload. Whether it met its SLO depends on the machine's load, so
    # the attainment is any share.
    completion(base, "llama", world["secret"])
    page.wait_for_function(
        f"""() => document.querySelector(
            'tr[data-tenant="{tenant.pk}"] [data-field="w1-joint"]').textContent !== "—"
        """,
        timeout=60_000,
    )
    percent = re.compile(r"\d+\.\d%")
    for field in ("w1-ttft", "w1-tbt", "w1-joint", "w60-joint"):
        assert percent.fullmatch(cell(browser, tenant.pk, field)), field
    assert cell(browser, tenant.pk, "rps") == "0.02"  # one request in the last 60 s
    assert cell(browser, tenant.pk, "errors") == "0"
    assert page.evaluate("window.__notReloaded") is True
    page.wait_for_function(
        "() => document.getElementById('chart-fine').data.some("
        "t => t.y.some(v => typeof v === 'number'))",
        timeout=30_000,
    )
    browser.shot("overview")

    # A tenant created now gets its row (in name order) and chart line without a
    # reload; deleted, both go.
    newcomer = in_thread(tenant_create, name="a-newcomer")
    row = f'tr[data-tenant="{newcomer.pk}"]'
    page.wait_for_selector(row, timeout=30_000)
    assert page.evaluate(
        "Array.from(document.querySelectorAll('#tenants tr[data-tenant]'), r => r.dataset.tenant)"
    ) == [str(newcomer.pk), str(tenant.pk)]
    assert page.text_content(f"{row} a") == "a-newcomer"
    assert (
        cell(browser, newcomer.pk, "w1-joint") == "—"
        and cell(browser, newcomer.pk, "rps") == "0.00"
    )
    page.wait_for_function(
        "() => document.getElementById('chart-minute').data.some(t => t.name === 'a-newcomer')",
        timeout=30_000,
    )
    browser.shot("overview-new-tenant")
    in_thread(newcomer.delete)
    page.wait_for_selector(row, state="detached", timeout=30_000)
    page.wait_for_function(
        "() => !document.getElementById('chart-minute').data.some(t => t.name === 'a-newcomer')",
        timeout=30_000,
    )
    assert page.evaluate("window.__notReloaded") is True

    # The node page draws the real engine's memory map.
    page.goto(f"{base}/console/nodes/{node.pk}/")
    page.wait_for_selector("#live.on", timeout=30_000)
    names = page.evaluate("document.getElementById('chart-memory').data.map(t => t.name)")
    assert {"llama weights", "qwen weights", "free", "KV swap free"} <= set(names)
    assert page.locator("#chart-memory .main-svg").count() > 0
    holder = page.text_content('[data-field="turn_holder"]')
    assert holder == node.state["tenancy"]["turn_holder"]
    assert page.locator("#models-body tr").count() == 2
    # Device and host memory each on its own axis, in its own unit.
    axes = page.evaluate(
        "(() => { const l = document.getElementById('chart-memory').layout;"
        " return [l.xaxis.title.text, l.xaxis2.title.text]; })()"
    )
    assert axes[0].startswith("device, ") and axes[1].startswith("host, ")
    browser.shot("node")

    # The tenant page: the request in its deployment's latency histograms.
    page.goto(f"{base}/console/tenants/{tenant.pk}/")
    page.wait_for_selector("#chart-ttft .main-svg", timeout=30_000)
    names = page.evaluate("document.getElementById('chart-ttft').data.map(t => t.name)")
    assert names == ["llama @ cpu-node"]
    # A recent request's row is marked by its SLO outcome, not painted by its status.
    classes = page.evaluate(
        "Array.from(document.querySelectorAll('table.recent tbody tr'), r => r.className)"
    )
    assert classes and all(c in {"row-ok", "row-warn", "row-miss"} for c in classes)
    browser.shot("tenant")

    for name, path in (
        ("deployments", "/console/deployments/"),
        ("benchmarks-empty", "/console/benchmarks/"),
    ):
        page.goto(base + path)
        page.wait_for_load_state("networkidle")
        assert page.locator("#live").is_hidden()  # no live updates here: no badge
        browser.shot(name)
    assert page.locator("#no-benchmarks").is_visible()

    # A finished run: benchmarks.js draws its charts with Plotly.
    def finished() -> None:
        job = sim_job()
        finished_run(job, [result("lvf", 1.0, 1.0, 100.0), result("lvf", 2.0, 0.8, 300.0)])

    in_thread(finished)
    page.goto(base + "/console/benchmarks/")
    for chart in ("chart-attainment", "chart-ttft", "chart-tpot"):
        page.wait_for_selector(f"#{chart} .main-svg .scatterlayer .trace", timeout=30_000)
    traces = page.evaluate("document.getElementById('chart-attainment').data.length")
    assert traces > 0
    browser.shot("benchmarks")

    assert browser.problems == []
