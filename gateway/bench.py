"""``shunter bench gateway``: what the gateway adds to TTFT and ITL.

One ``shunter engine`` process (tiny-llama, CPU) and one ``shunter web`` process in front
of it, with a tenant, a key and quotas high enough never to refuse (so admission runs in
full). By default the gateway runs on the production path: PostgreSQL (a throwaway
database on ``DATABASE_URL``'s server, created, migrated and dropped by the run) and
Redis (``REDIS_URL``, else a database of the benchmark's own, flushed before and after),
so every request's admission is a Redis round trip and its record a PostgreSQL write.
``embedded=True`` (``--embedded``) runs it on a throwaway embedded platform instead
(SQLite, in-process quotas). The same streaming ``/v1/completions`` requests
(equal-length random prompts, greedy, EOS ignored) go straight to the engine and through
the gateway with the key, N at a time, in alternated rounds with the samples pooled; each
token is timed on arrival of the SSE chunk that carries its id. Host wall time on this
machine; the processes share its cores.

Runs in its own process: it points Django at the throwaway platform before setting it up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from shunter.engine.benchfigure import BenchFigure, ReportItem
from shunter.engine.loadgen.engine_process import (
    MODEL,
    PRESET,
    Timings,
    free_port,
    median_ratio,
    random_prompts,
    ratio,
    start_engine,
    stream_completions,
    wait_until_up,
)

ENGINE_KV_TOKENS = 65536
TTFT_RATIO_TARGET = 1.10
ADDED_ITL_TARGET_MS = 1.0
# The production path's server when DATABASE_URL is unset; the run's own database on it
# is the URL's name with THROWAWAY_SUFFIX (shunter_bench_gateway), so it never names a
# database the platform itself uses.
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/shunter"
THROWAWAY_SUFFIX = "_bench_gateway"
# When REDIS_URL is unset: a Redis database of the benchmark's own, flushed before and
# after. A REDIS_URL given is used as it is: the run deletes its tenant's quota counts
# there and nothing else.
OWN_REDIS_URL = "redis://127.0.0.1:6379/15"
# The caller's settings the gateway must not inherit: the platform sets its own.
NOT_INHERITED = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "SHUNTER_ENGINE_TOKEN")


class BenchError(RuntimeError):
    """The platform the gateway runs on could not be set up (a one-line reason)."""


@dataclass(frozen=True)
class Platform:
    """What the gateway runs on: its environment, and a line saying which path it is."""

    env: dict[str, str]
    description: str


def bench_gateway(
    *,
    model_dir: Path | None = None,
    streams: int = 32,
    requests: int = 32,
    prompt_tokens: int = 64,
    max_tokens: int = 32,
    threads: int = 1,
    rounds: int = 3,
    embedded: bool = False,
) -> Iterator[ReportItem]:
    """Run the comparison on the production path (``embedded``: the embedded one) and
    yield the report: the path measured, median (and p90 ITL) per path, the TTFT and ITL
    ratios and the median ITL the gateway adds; then the figures ``gateway.ttft_ratio``
    and ``gateway.added_itl_ms``. BenchError: PostgreSQL or Redis cannot be used."""
    with bench_platform(model_dir, embedded=embedded) as (on, model):
        yield from _compare(
            on, model, streams, requests, prompt_tokens, max_tokens, threads, rounds
        )


@contextlib.contextmanager
def bench_platform(model_dir: Path | None, *, embedded: bool) -> Iterator[tuple[Platform, Path]]:
    """A throwaway platform (``embedded``, else the production path) and the model to
    serve: ``model_dir``, else tiny-llama with random weights, both gone after the run."""
    from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config

    platform = embedded_platform if embedded else production_platform
    with (
        tempfile.TemporaryDirectory(prefix="shunter-bench-gateway-") as tmp,
        platform(Path(tmp) / "var") as on,
    ):
        if model_dir is None:
            model_dir = init_model_dir(Path(tmp) / PRESET, config=preset_config(PRESET), seed=0)
        yield on, model_dir


def _compare(
    platform: Platform,
    model_dir: Path,
    streams: int,
    requests: int,
    prompt_tokens: int,
    max_tokens: int,
    threads: int,
    rounds: int,
) -> Iterator[ReportItem]:
    engine, engine_url = start_engine(model_dir, ENGINE_KV_TOKENS, threads)
    gateway, tenant = None, None
    try:
        secret, tenant = register_model(platform.env, [engine_url], model_dir)
        log = Path(platform.env["SHUNTER_VAR_DIR"]) / "gateway.log"
        gateway, gateway_url = start_gateway(platform.env, log)
        with urllib.request.urlopen(gateway_url + "/healthz", timeout=10) as r:
            health = json.load(r)
        yield (
            f"gateway on the {platform.description}; its /healthz: database "
            f"{health.get('database')}, redis {health.get('redis', 'not used')}"
        )
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
            f"{TTFT_RATIO_TARGET:.2f}x), added median ITL {added:+.3f} ms (target <= "
            f"{ADDED_ITL_TARGET_MS:g} ms)"
        )
        ttft_ratio = median_ratio(through.ttft, direct.ttft)
        if ttft_ratio is not None:
            yield BenchFigure("gateway.ttft_ratio", ttft_ratio, TTFT_RATIO_TARGET, "<=", "x")
        yield BenchFigure("gateway.added_itl_ms", added, ADDED_ITL_TARGET_MS, "<=", "ms")
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(timeout=30)
        engine.terminate()
        engine.wait(timeout=60)
        if tenant is not None and platform.env.get("REDIS_URL"):
            forget_quotas(platform.env["REDIS_URL"], tenant)


def _base_env(var_dir: Path) -> dict[str, str]:
    """This process's environment without ``NOT_INHERITED``, with data in ``var_dir``,
    plain HTTP on loopback and warnings only in the log."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env.update(
        SHUNTER_VAR_DIR=str(var_dir),
        SHUNTER_HTTPS="0",
        SHUNTER_LOG_LEVEL="WARNING",
        DJANGO_SETTINGS_MODULE="shunter.project.settings",
    )
    return env


@contextlib.contextmanager
def embedded_platform(var_dir: Path) -> Iterator[Platform]:
    """The embedded default in ``var_dir``: SQLite, in-process quotas."""
    env = _base_env(var_dir)
    env["DATABASE_URL"] = f"sqlite:///{var_dir / 'platform.sqlite3'}"
    yield Platform(env, "embedded path (--embedded): SQLite, in-process quotas")


@contextlib.contextmanager
def production_platform(var_dir: Path) -> Iterator[Platform]:
    """PostgreSQL and Redis: a database created on ``DATABASE_URL``'s server (default
    ``DEFAULT_DATABASE_URL``) and dropped on exit; ``REDIS_URL`` as it is, else
    ``OWN_REDIS_URL``, flushed on entry and on exit. BenchError: either cannot be used."""
    server_url = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    given_redis = os.environ.get("REDIS_URL")
    redis_url = given_redis or OWN_REDIS_URL
    database_url, name = _throwaway_database(server_url)
    _redis(redis_url, flush=not given_redis)
    _postgres(server_url, "DROP DATABASE IF EXISTS {} WITH (FORCE)", name)
    _postgres(server_url, "CREATE DATABASE {}", name)
    try:
        env = _base_env(var_dir)
        env.update(DATABASE_URL=database_url, REDIS_URL=redis_url)
        flushed = "" if given_redis else ", the benchmark's own database, flushed"
        yield Platform(
            env,
            f"production path: PostgreSQL (database {name}, created for this run and "
            f"dropped after) and Redis ({_redacted(redis_url)}{flushed})",
        )
    finally:
        _postgres(server_url, "DROP DATABASE IF EXISTS {} WITH (FORCE)", name)
        if not given_redis:
            _redis(redis_url, flush=True)


def _throwaway_database(server_url: str) -> tuple[str, str]:
    """The URL and name of the run's database on ``server_url``'s server."""
    parts = urlsplit(server_url)
    if parts.scheme.lower() not in {"postgres", "postgresql", "pgsql"}:
        raise BenchError(
            f"the production path needs PostgreSQL, and DATABASE_URL is {parts.scheme}:// "
            "(use --embedded for SQLite)"
        )
    name = (unquote(parts.path.lstrip("/")) or "shunter") + THROWAWAY_SUFFIX
    return parts._replace(path=f"/{name}").geturl(), name


def _postgres(server_url: str, statement: str, name: str) -> None:
    """Run ``statement`` with the database ``name`` quoted into its ``{}``, connected to
    the maintenance database of ``server_url``'s server."""
    import psycopg
    from psycopg import sql

    maintenance = urlsplit(server_url)._replace(path="/postgres").geturl()
    try:
        with psycopg.connect(maintenance, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL(statement).format(sql.Identifier(name)))
    except psycopg.Error as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BenchError(f"PostgreSQL at {_redacted(server_url)}: {reason}") from None


def _redis(url: str, *, flush: bool) -> None:
    """Check that Redis at ``url`` answers; with ``flush``, empty its database."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=30)
    try:
        if flush:
            client.flushdb()
        else:
            client.ping()
    except redis.RedisError as e:
        raise BenchError(f"Redis at {_redacted(url)}: {e}") from None
    finally:
        client.close()


def _redacted(url: str) -> str:
    """``url`` without its user name and password."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return parts._replace(netloc=f"{host}{port}", query="").geturl()


def register_model(
    env: Mapping[str, str], engine_urls: Sequence[str], model_dir: Path
) -> tuple[str, str]:
    """Migrate the throwaway platform and register the model of the engines at
    ``engine_urls`` (a node and a deployment each) for one tenant; return the tenant
    key's secret and the tenant's id."""
    for name in NOT_INHERITED:
        os.environ.pop(name, None)
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    from shunter.platform.models import Deployment, SloClass
    from shunter.platform.services import model_create, node_create
    from shunter.tenants.services import api_key_create, tenant_create

    call_command("migrate", interactive=False, verbosity=0)
    model = model_create(name=MODEL, source_dir=str(model_dir))
    slo = SloClass.objects.get(name="standard")
    # The engines already serve the model: the rows are written directly, with no push
    # of the nodes' deployments to the engines (the services would reconcile them).
    deployments = [
        Deployment.objects.create(
            node=node_create(name=f"bench-{i}", engine_url=url, hbm_bytes=80 * 1024**3),
            model=model,
            slo_class=slo,
        )
        for i, url in enumerate(engine_urls)
    ]
    tenant = tenant_create(
        name="bench",
        default_slo_class=slo,
        deployments=deployments,
        rpm_limit=1_000_000,
        tpm_limit=1_000_000_000,
        concurrency_limit=10_000,
    )
    _, secret = api_key_create(tenant=tenant, name="bench", all_deployments=True)
    connections.close_all()  # the database is dropped at the end of the run
    return secret, str(tenant.pk)


def forget_quotas(redis_url: str, tenant: str) -> None:
    """Delete the run's quota counts from Redis (a REDIS_URL given is not flushed)."""
    from shunter.gateway.quotas import RedisQuotaLimiter

    async def forget() -> None:
        limiter = RedisQuotaLimiter(redis_url)
        try:
            await limiter.reset(tenant)
        finally:
            await limiter.aclose()

    asyncio.run(forget())


def start_gateway(env: Mapping[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``shunter web`` on a free loopback port, once its /healthz answers."""
    port = free_port()
    shunter = Path(sys.executable).with_name("shunter")
    command = [str(shunter), "web", "--port", str(port), "--log-level", "warning"]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=dict(env), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until_up(proc, url + "/healthz", lambda: f"shunter web did not start:\n{log.read_text()}")
    return proc, url
