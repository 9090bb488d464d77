"""``shunter demo``: the whole platform on this machine, on the embedded default.

The pieces, in the order ``shunter demo`` runs them (``cmd_demo`` composes them):

1. ``ensure_model_dirs``: tiny-llama and tiny-qwen2 shapes with ``DEMO_LAYERS`` layers
   (random weights) under ``var/models/``, made once.
2. ``EngineProcess.start``: ``shunter engine`` as a child on a free loopback port with a
   fresh token, serving tiny-llama (temporal) and tiny-qwen2 (spatial) in an arena of
   ``HBM_BUDGET`` bytes with remapping on, so that bursts rotate KV to host memory and
   borrow the idle temporal model's layers.
3. ``prepare`` (Django set up, the engine answering): migrate, the admin user
   (``admin_user_ensure``), ``seed_demo``, the node pointed at this run's engine, one
   reconcile and one poll; the tenants' keys go to ``var/demo/keys.json`` (mode 0600).
4. ``NodePoller``: a thread calling the ``node_poll`` service every ``POLL_INTERVAL_S``,
   in place of Celery beat (which the embedded default does not run), so the node's
   status and memory map stay live.
5. ``LoadProcess``: the load generator as a child process (``python -m
   shunter.project.demo load``, its plan on stdin): each demo tenant sends bursty (gamma)
   streaming requests through the gateway with its own key, at rates a 2-core CPU keeps up
   with.
6. ``serve``: uvicorn until SIGINT or SIGTERM; the load generator is stopped first (so
   the server's graceful shutdown has no new requests to wait for), then the poller and
   the engine. Children live in their own sessions (a terminal's Ctrl-C reaches only the
   demo, which stops them in that order) and die with the demo if it is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import itertools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

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
POLL_INTERVAL_S = 2.0
ENGINE_START_S = 180.0
CHILD_STOP_S = 20.0
# Seconds the web server gives open connections to finish on shutdown.
GRACEFUL_SHUTDOWN_S = 5
KEYS_FILE = "keys.json"


class DemoError(Exception):
    """The demo cannot come up; the message says why (and where the logs are)."""


@dataclass(frozen=True)
class LoadStream:
    """One tenant's share of the background load: ``rate`` requests/s with gamma gaps of
    shape ``burstiness`` (below 1: bursts), prompts of ``prompt_words`` random words (about
    2.4 tiny-tokenizer tokens each) asking for ``output_tokens``; both are lengths as
    ``shunter bench serve`` reads them (``N``, ``LO..HI``, ``exp:MEAN``)."""

    tenant: str
    model: str
    rate: float
    burstiness: float
    prompt_words: str
    output_tokens: str


# The tenants of seed_demo: interactive chat on the temporal model, batch jobs with long
# prompts and replies on the spatial one, in tight bursts (gamma shape 0.15: gaps with a
# CV of 2.6), whose KV outgrows the arena and rotates. Modest mean rates: the engine, the
# web server and this generator share a 2-core CPU.
LOAD = (
    LoadStream("demo-chat", "tiny-llama", 0.6, 0.3, "40..200", "16..64"),
    LoadStream("demo-batch", "tiny-qwen2", 0.4, 0.15, "250..550", "128..256"),
)
# The generator reports each stream every this many seconds (its arrivals are drawn a
# chunk at a time).
LOAD_CHUNK_S = 120.0


@dataclass(frozen=True)
class DemoPaths:
    """Where the demo keeps its files, under the platform's ``VAR_DIR``."""

    var_dir: Path

    @property
    def models(self) -> Path:
        return self.var_dir / "models"

    @property
    def demo(self) -> Path:
        return self.var_dir / "demo"

    @property
    def keys(self) -> Path:
        return self.demo / KEYS_FILE

    @property
    def engine_log(self) -> Path:
        return self.demo / "engine.log"

    @property
    def load_log(self) -> Path:
        return self.demo / "load.log"


# -- children ---------------------------------------------------------------------------------
def _shunter(*args: str) -> list[str]:
    """The ``shunter`` command of this interpreter (no reliance on PATH)."""
    return [sys.executable, "-m", "shunter.project.cli", *args]


def _die_with_parent() -> None:
    """In a child before exec: on Linux, receive SIGTERM when the demo dies, even by
    SIGKILL, so no engine or generator outlives it."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _spawn(command: Sequence[str], log: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            **kwargs,
        )


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = CHILD_STOP_S) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``; reaps the child either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
        command = _shunter(
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

    @classmethod
    def start(cls, model_dirs: dict[str, Path], log: Path) -> EngineProcess:
        """Start it on a free loopback port with a fresh token (given in the
        environment, not on a command line others can read); it is not up yet."""
        port, token = free_port(), secrets.token_urlsafe(24)
        command = _shunter(
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
        env = {**os.environ, "SHUNTER_ENGINE_TOKEN": token}
        proc = _spawn(command, log, env=env)
        return cls(proc, f"http://127.0.0.1:{port}", token, log)

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
        _stop(self.proc)


# -- the control plane ------------------------------------------------------------------------
def _read_keys(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(tenant): str(entry["key"])
        for tenant, entry in data.items()
        if isinstance(entry, dict) and isinstance(entry.get("key"), str)
    }


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600 from creation on, then
    renamed over the old file, so no other user ever sees it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    partial.replace(path)


def _drop_unknown_keys(known: dict[str, str]) -> dict[str, str]:
    """The ``known`` secrets still usable; each demo tenant without one has its demo key
    revoked, so that ``seed_demo`` issues a new one (a secret is shown only once: a key
    whose secret is lost can only be replaced)."""
    from shunter.project.management.commands.seed_demo import KEY_NAME, TENANTS
    from shunter.tenants import services as tenant_services
    from shunter.tenants.keys import secret_digest
    from shunter.tenants.models import ApiKey

    usable: dict[str, str] = {}
    for tenant, _, _ in TENANTS:
        keys = ApiKey.objects.usable().filter(tenant__name=tenant, name=KEY_NAME)
        secret = known.get(tenant)
        if secret is not None and keys.filter(digest=secret_digest(secret)).exists():
            usable[tenant] = secret
            continue
        for key in keys:
            tenant_services.api_key_revoke(api_key=key)
    return usable


@dataclass(frozen=True)
class Prepared:
    """What ``prepare`` set up: the node's id and each tenant's key secret."""

    node_id: int
    secrets: dict[str, str]


def prepare(
    *, paths: DemoPaths, model_dirs: dict[str, Path], engine: EngineProcess | None
) -> Prepared:
    """Register the demo (``seed_demo``, idempotent), point its node at ``engine`` (its
    URL, token and HBM; reconciled and polled once) and keep the tenants' keys in
    ``paths.keys``. Without an engine (``--no-serve``) the rows are registered and
    nothing is called."""
    from shunter.platform import services
    from shunter.platform.models import Model, Node
    from shunter.project.management.commands.seed_demo import seed_demo

    known = _drop_unknown_keys(_read_keys(paths.keys))
    seeded = seed_demo(
        engine_url=engine.url if engine else "http://127.0.0.1:8100",
        engine_token=engine.token if engine else "",
        llama_dir=str(model_dirs["tiny-llama"]),
        qwen_dir=str(model_dirs["tiny-qwen2"]),
        hbm_bytes=HBM_BUDGET,
    )
    for name, path in model_dirs.items():
        model = Model.objects.get(name=name)
        if model.source_dir != str(path):  # the var dir moved since the first run
            services.model_update(model=model, source_dir=str(path))
    node = Node.objects.get(name="demo")
    if engine is not None:
        node = services.node_update(
            node=node, engine_url=engine.url, engine_token=engine.token, hbm_bytes=HBM_BUDGET
        )
        reconciled = services.node_reconcile(node=node)
        if not reconciled.ok:
            raise DemoError(f"the engine refused the demo deployments: {reconciled.error}")
        if not services.node_poll(node=node).healthy:
            raise DemoError(f"the engine stopped answering: {node.last_error}")
    keys = {**known, **seeded.secrets}
    models = {stream.tenant: stream.model for stream in LOAD}
    write_private(
        paths.keys,
        json.dumps(
            {tenant: {"key": key, "model": models.get(tenant)} for tenant, key in keys.items()},
            indent=2,
        )
        + "\n",
    )
    return Prepared(node_id=node.pk, secrets=keys)


def use_wal(database: str = "default") -> None:
    """Put an SQLite database in write-ahead-log mode (kept in the file): the console's
    readers then never block the gateway's record writes, nor the poller's."""
    from django.db import connections

    connection = connections[database]
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")


class NodePoller(threading.Thread):
    """Calls ``node_poll`` on a node every ``interval_s`` until ``stop``: beat's job
    (``nodes_poll``), done in-process because the embedded default runs no beat. A poll
    that fails is logged and retried at the next tick."""

    def __init__(self, node_id: int, interval_s: float = POLL_INTERVAL_S) -> None:
        super().__init__(name="shunter-demo-node-poll", daemon=True)
        self.node_id, self.interval_s = node_id, interval_s
        self._stopped = threading.Event()

    def run(self) -> None:
        import logging

        from django.db import close_old_connections, connection

        from shunter.platform import services
        from shunter.platform.models import Node

        log = logging.getLogger("shunter.project.demo")
        try:
            while not self._stopped.wait(self.interval_s):
                try:
                    node = Node.objects.filter(pk=self.node_id).first()
                    if node is not None:
                        services.node_poll(node=node)
                except Exception:  # a locked database, a restarting engine: try again
                    log.exception("demo node poll failed")
                finally:
                    close_old_connections()
        finally:
            connection.close()

    def stop(self) -> None:
        self._stopped.set()
        if self.is_alive():
            self.join(timeout=CHILD_STOP_S)


# -- the load generator -----------------------------------------------------------------------
@dataclass
class LoadProcess:
    """The background load generator (``python -m shunter.project.demo load``)."""

    proc: subprocess.Popen[bytes]

    @classmethod
    def start(cls, base_url: str, secrets_by_tenant: dict[str, str], log: Path) -> LoadProcess:
        """Start it against the gateway at ``base_url``; the plan, keys included, goes
        on its stdin. It waits for the gateway to answer before it sends."""
        plan = {
            "base_url": base_url,
            "streams": [
                {**asdict(stream), "key": secrets_by_tenant[stream.tenant]}
                for stream in LOAD
                if stream.tenant in secrets_by_tenant
            ],
        }
        proc = _spawn(
            [sys.executable, "-m", "shunter.project.demo", "load"], log, stdin=subprocess.PIPE
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(plan).encode())
        proc.stdin.close()
        return cls(proc)

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM) without waiting: safe in a signal handler."""
        if self.proc.poll() is None:
            self.proc.terminate()

    def stop(self) -> None:
        _stop(self.proc)


async def _wait_for_gateway(base_url: str, timeout_s: float) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(base_url + "/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise DemoError(f"{base_url} did not answer within {timeout_s:.0f} s")
            await asyncio.sleep(0.5)


async def _run_stream(base_url: str, stream: LoadStream, key: str, index: int) -> None:
    """Send ``stream`` forever, a chunk of arrivals at a time, reporting each chunk."""
    from shunter.engine.loadgen.arrivals import ArrivalProcess
    from shunter.engine.loadgen.client import Target
    from shunter.engine.loadgen.runner import run_rate_async
    from shunter.engine.loadgen.workload import LengthDist, SyntheticWorkload

    target = Target(base_url, stream.model, key)
    workload = SyntheticWorkload(
        LengthDist.parse(stream.prompt_words), LengthDist.parse(stream.output_tokens)
    )
    for chunk in itertools.count():
        result = await run_rate_async(
            target,
            workload,
            stream.rate,
            arrival=ArrivalProcess(stream.burstiness),
            duration_s=LOAD_CHUNK_S,
            seed=chunk * len(LOAD) + index,
            request_timeout_s=60.0,
        )
        report = result.report
        errors = sorted({r.error_type or str(r.status) for r in result.requests if not r.success})
        print(
            f"{stream.tenant} -> {stream.model}: {report.completed} of {report.num_prompts} "
            f"requests completed, median TTFT {report.median_ttft_ms or 0:.0f} ms, median "
            f"TPOT {report.median_tpot_ms or 0:.1f} ms"
            + (f", failures: {', '.join(errors)}" if errors else ""),
            flush=True,
        )


async def run_load(plan: dict[str, Any], *, gateway_wait_s: float = 120.0) -> None:
    """Run a load plan (``LoadProcess.start`` writes it) until cancelled."""
    base_url = str(plan["base_url"])
    await _wait_for_gateway(base_url, gateway_wait_s)
    streams = [
        (LoadStream(**{k: v for k, v in s.items() if k != "key"}), str(s["key"]))
        for s in plan["streams"]
    ]
    print(f"load: {', '.join(f'{s.tenant} at {s.rate:g} req/s' for s, _ in streams)}", flush=True)
    await asyncio.gather(
        *(_run_stream(base_url, stream, key, i) for i, (stream, key) in enumerate(streams))
    )


def load_main(stdin: IO[str]) -> int:
    """The load generator child: read the plan, send until SIGTERM or SIGINT, exit 0."""
    from shunter.engine.loadgen.runner import run_async

    plan = json.loads(stdin.read())

    async def until_signalled() -> None:
        task = asyncio.ensure_future(run_load(plan))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        run_async(until_signalled())
    except DemoError as e:
        print(f"load: {e}", file=sys.stderr)
        return 1
    return 0


# -- the web server ---------------------------------------------------------------------------
def serve(host: str, port: int, *, on_exit: Callable[[], None]) -> None:
    """Serve the ASGI application (as ``shunter web``) until SIGINT or SIGTERM, calling
    ``on_exit`` once when the first arrives, before the server stops accepting. Returns
    normally on either signal (exit status 0)."""
    import uvicorn

    from shunter.gateway.server import GatewayHttpProtocol

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.should_exit:
                on_exit()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        "shunter.project.asgi:application",
        host=host,
        port=port,
        http=GatewayHttpProtocol,  # as ``shunter web``
        proxy_headers=True,
        forwarded_allow_ips=os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1"),
        lifespan="on",  # the gateway closes its connections at shutdown
        # The console shows the traffic; a line per load-generator request would bury
        # the demo's own messages.
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    # uvicorn raises the signal it stopped on again once it is done; these handlers
    # receive it, so the demo goes on to stop its children and exits 0.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        Server(config).run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def local_url(host: str, port: int) -> str:
    """The URL this machine reaches the server at (a wildcard bind through loopback)."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shunter.project.demo")
    parser.add_argument("role", choices=("load",), help="load: the demo's load generator")
    parser.parse_args(argv)
    return load_main(sys.stdin)


if __name__ == "__main__":
    raise SystemExit(main())
