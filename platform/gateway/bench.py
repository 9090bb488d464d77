"""``shunter bench gateway``: what the gateway adds to TTFT and ITL.

One ``shunter engine`` process (tiny-llama, CPU) and one ``shunter web`` process in front
of it, on a throwaway embedded platform (SQLite, in-process quotas) with a tenant, a key
and quotas high enough never to refuse (so admission runs in full). The same streaming
``/v1/completions`` requests (equal-length random prompts, greedy, EOS ignored) go
straight to the engine and through the gateway with the key, N at a time, in alternated
rounds with the samples pooled; each token is timed on arrival of the SSE chunk that
carries its id. Host wall time on this machine; the processes share its cores.

Runs in its own process: it points Django at the throwaway platform before setting it up.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from shunter.engine.server.bench import (
    MODEL,
    PRESET,
    Timings,
    free_port,
    random_prompts,
    ratio,
    start_engine,
    stream_completions,
    wait_until_up,
)

ENGINE_KV_TOKENS = 65536


def bench_gateway(
    *,
    model_dir: Path | None = None,
    streams: int = 32,
    requests: int = 32,
    prompt_tokens: int = 64,
    max_tokens: int = 32,
    threads: int = 1,
    rounds: int = 3,
) -> Iterator[str]:
    """Run the comparison and yield the report: median (and p90 ITL) per path, the TTFT
    and ITL ratios, and the median ITL the gateway adds."""
    from shunter.engine.exec.model_init import init_model_dir, preset_config

    with tempfile.TemporaryDirectory(prefix="shunter-bench-gateway-") as tmp:
        if model_dir is None:
            model_dir = init_model_dir(Path(tmp) / PRESET, config=preset_config(PRESET), seed=0)
        env = _platform_env(Path(tmp) / "var")
        engine, engine_url = start_engine(model_dir, ENGINE_KV_TOKENS, threads)
        gateway = None
        try:
            secret = _register(env, engine_url, model_dir)
            gateway, gateway_url = _start_gateway(env, Path(tmp) / "gateway.log")
            prompts = random_prompts(requests, prompt_tokens)
            yield (
                f"{model_dir.name} on cpu, engine with {threads} thread(s): {requests} "
                f"requests x {prompt_tokens} prompt tokens, {max_tokens} output tokens, "
                f"{streams} concurrent streams, greedy, {rounds} alternated rounds"
            )
            auth = {"Authorization": f"Bearer {secret}"}
            paths: dict[str, tuple[str, dict[str, str]]] = {
                "engine": (engine_url, {}),
                "gateway": (gateway_url, auth),
            }
            for url, headers in paths.values():  # warm-up: connections, caches, first steps
                asyncio.run(stream_completions(url, prompts[:2], max_tokens, 2, headers))
            timings = {name: Timings() for name in paths}
            for _ in range(rounds):
                for name, (url, headers) in paths.items():
                    run = stream_completions(url, prompts, max_tokens, streams, headers)
                    timings[name].extend(asyncio.run(run))
            yield f"{'path':10} {'TTFT p50 ms':>12} {'ITL p50 ms':>11} {'ITL p90 ms':>11}"
            for name, t in timings.items():
                yield f"{name:10} {t.row(12, 11, 11)}"
            direct, through = timings["engine"], timings["gateway"]
            yield (
                f"{'ratio':10} {ratio(through.ttft, direct.ttft):>12} "
                f"{ratio(through.itl, direct.itl):>11}"
            )
            added = 1000 * (statistics.median(through.itl) - statistics.median(direct.itl))
            yield (
                f"gateway/engine: TTFT ratio {ratio(through.ttft, direct.ttft)} (target <= "
                f"1.10x), added median ITL {added:+.3f} ms (target <= 1 ms)"
            )
        finally:
            if gateway is not None:
                gateway.terminate()
                gateway.wait(timeout=30)
            engine.terminate()
            engine.wait(timeout=60)


def _platform_env(var_dir: Path) -> dict[str, str]:
    """The embedded default in ``var_dir``: SQLite, in-process quotas, plain HTTP."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"REDIS_URL", "SECRET_KEY", "DEBUG", "SHUNTER_ENGINE_TOKEN"}
    }
    env.update(
        DATABASE_URL=f"sqlite:///{var_dir / 'platform.sqlite3'}",
        SHUNTER_VAR_DIR=str(var_dir),
        SHUNTER_HTTPS="0",
        SHUNTER_LOG_LEVEL="WARNING",
        DJANGO_SETTINGS_MODULE="shunter.platform.settings",
    )
    return env


def _register(env: Mapping[str, str], engine_url: str, model_dir: Path) -> str:
    """Migrate the throwaway platform and register the engine's model for one tenant;
    return the tenant key's secret."""
    os.environ.update(env)
    os.environ.pop("REDIS_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    from shunter.platform.models import Deployment, SloClass
    from shunter.platform.services import model_create, node_create
    from shunter.tenants.services import api_key_create, tenant_create

    call_command("migrate", interactive=False, verbosity=0)
    node = node_create(name="bench", engine_url=engine_url, hbm_bytes=80 * 1024**3)
    model = model_create(name=MODEL, source_dir=str(model_dir))
    slo = SloClass.objects.get(name="standard")
    # The engine already serves the model: the row is written directly, with no push of
    # the node's deployments to the engine (the services would reconcile it).
    deployment = Deployment.objects.create(node=node, model=model, slo_class=slo)
    tenant = tenant_create(
        name="bench",
        default_slo_class=slo,
        deployments=[deployment],
        rpm_limit=1_000_000,
        tpm_limit=1_000_000_000,
        concurrency_limit=10_000,
    )
    _, secret = api_key_create(tenant=tenant, name="bench", all_deployments=True)
    return secret


def _start_gateway(env: Mapping[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``shunter web`` on a free loopback port, once its /healthz answers."""
    port = free_port()
    shunter = Path(sys.executable).with_name("shunter")
    command = [str(shunter), "web", "--port", str(port), "--log-level", "warning"]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=dict(env), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until_up(proc, url + "/healthz", lambda: f"shunter web did not start:\n{log.read_text()}")
    return proc, url
