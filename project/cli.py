"""The ``shunter`` command.

``shunter manage ...``, ``shunter worker ...`` and ``shunter beat ...`` pass their
arguments through to Django and Celery; the other subcommands are parsed here.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

SETTINGS = "shunter.project.settings"

# Subcommands whose arguments belong to another program: name -> one-line help.
PASSTHROUGH = {
    "manage": "run a Django management command (migrate, createsuperuser, check, ...)",
    "worker": "run a Celery worker (arguments go to `celery worker`)",
    "beat": "run the Celery beat scheduler (arguments go to `celery beat`)",
}


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    import django

    django.setup()


def run_manage(args: Sequence[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    from django.core.management import execute_from_command_line

    execute_from_command_line(["shunter manage", *args])
    return 0


def run_worker(args: Sequence[str]) -> int:
    from shunter.project.celery import app

    app.worker_main(["worker", "--loglevel=INFO", *args])
    return 0


def run_beat(args: Sequence[str]) -> int:
    from django.conf import settings

    from shunter.project.celery import app

    schedule = settings.VAR_DIR / "celerybeat-schedule"
    schedule.parent.mkdir(parents=True, exist_ok=True)
    app.start(["beat", "--loglevel=INFO", f"--schedule={schedule}", *args])
    return 0


def serve(host: str, port: int, *, log_level: str = "info") -> None:
    """Serve the ASGI application (HTTP and websockets) until interrupted."""
    import uvicorn

    from shunter.gateway.server import GatewayHttpProtocol
    from shunter.platform.access_log import uvicorn_log_config

    uvicorn.run(
        "shunter.project.asgi:application",
        host=host,
        port=port,
        http=GatewayHttpProtocol,  # bounded request heads, refusals in OpenAI's format
        log_level=log_level,
        log_config=uvicorn_log_config(),  # query values redacted: they may hold keys
        proxy_headers=True,
        forwarded_allow_ips=os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1"),
        lifespan="on",  # the gateway closes its connections at shutdown
    )


def cmd_web(ns: argparse.Namespace) -> int:
    serve(ns.host, ns.port, log_level=ns.log_level)
    return 0


def cmd_demo(ns: argparse.Namespace) -> int:
    """Bring the whole platform up on the embedded default and serve it (the pieces are
    in ``shunter.project.demo``); with ``--no-serve``, register everything and exit."""
    # The embedded default: local development settings unless the caller chose otherwise.
    os.environ.setdefault("DEBUG", "1")
    os.environ.setdefault("SHUNTER_HTTPS", "0")
    _setup_django()
    import contextlib

    from django.conf import settings
    from django.core.management import call_command

    from shunter.platform import runtime
    from shunter.project import demo

    paths = demo.DemoPaths(settings.VAR_DIR)
    with contextlib.ExitStack() as running:  # children stop in reverse order of start
        try:
            model_dirs = demo.ensure_model_dirs(paths.models)
            engine = None
            if not ns.no_serve:  # it loads its models while the database migrates
                engine = demo.EngineProcess.start(model_dirs, paths.engine_log)
                running.callback(engine.stop)
            call_command("migrate", interactive=False, verbosity=0)
            demo.use_wal()
            info = runtime.describe()
            print(
                f"database: {info.database}, channel layer: {info.channel_layer}, "
                f"tasks: {info.task_mode}, data in {settings.VAR_DIR}"
            )
            _print_admin(ns.admin_user)
            if engine is not None:
                engine.wait_healthy()
                print(f"engine: {engine.url} (log: {engine.log})")
                scrape = engine.write_prometheus_config(paths.demo)
                print(f"prometheus: {scrape} (scrapes the engine's vLLM metrics)")
            prepared = demo.prepare(paths=paths, model_dirs=model_dirs, engine=engine)
        except demo.DemoError as e:
            print(f"shunter demo: {e}", file=sys.stderr)
            return 1
        print(f"tenant keys: {paths.keys} (mode 0600)")
        if ns.no_serve:
            return 0
        base = demo.local_url(ns.host, ns.port)
        poller = demo.NodePoller(prepared.node_id)
        # Children are forked with a pre-exec hook, which is only safe with no other
        # thread running: the generator starts before the poller's thread.
        load = demo.LoadProcess.start(base, prepared.secrets, paths.load_log)
        running.callback(poller.stop)
        running.callback(load.stop)
        poller.start()
        print(
            f"load generator: {', '.join(f'{s.tenant} -> {s.model}' for s in demo.LOAD)} "
            f"through the gateway (log: {paths.load_log})"
        )
        print(f"gateway: {base}/v1  admin: {base}/admin/  API: {base}/api/")
        print(f"console: {base}/console/  (Ctrl-C to stop)", flush=True)
        demo.serve(ns.host, ns.port, on_exit=load.terminate)
    return 0


def _print_admin(username: str) -> None:
    """Ensure the admin user and say how to log in (a generated password only once)."""
    from shunter.platform.services import admin_user_ensure

    ensured = admin_user_ensure(
        username=username, password=os.environ.get("SHUNTER_ADMIN_PASSWORD") or None
    )
    if ensured.password is not None and not os.environ.get("SHUNTER_ADMIN_PASSWORD"):
        print(f"admin user: {username}  password: {ensured.password}  (shown once)")
    elif ensured.password is not None:
        print(f"admin user: {username}  password: from SHUNTER_ADMIN_PASSWORD")
    else:
        print(f"admin user: {username} (exists; set SHUNTER_ADMIN_PASSWORD to reset it)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shunter",
        description="Shunter: multi-tenant LLM serving platform.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in PASSTHROUGH.items():
        sub.add_parser(name, help=help_text, add_help=False)

    web = sub.add_parser("web", help="serve the control plane (ASGI: HTTP and websockets)")
    web.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    web.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    web.add_argument("--log-level", default="info", help="uvicorn log level (default info)")
    web.set_defaults(func=cmd_web)

    demo = sub.add_parser(
        "demo",
        help="the whole platform on the embedded default: engine, web, load generator",
        description="Make two tiny models under var/models/, start an engine on them, "
        "migrate the embedded database, ensure an admin user, register the demo node, "
        "models, deployments, tenants and keys (var/demo/keys.json), poll the engine, "
        "start a background load generator through the gateway, and serve until Ctrl-C.",
    )
    demo.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    demo.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    demo.add_argument(
        "--admin-user",
        default=os.environ.get("SHUNTER_ADMIN_USER", "admin"),
        help="admin user name (default: $SHUNTER_ADMIN_USER or admin)",
    )
    demo.add_argument(
        "--no-serve",
        action="store_true",
        help="make the models, migrate, ensure the admin and register the demo, then exit "
        "(no engine, no load, no server)",
    )
    demo.set_defaults(func=cmd_demo)

    from shunter.engine.cli import register as register_engine_commands
    from shunter.gateway.cli import add_bench_gateway_parser

    register_engine_commands(sub, more_benches=(add_bench_gateway_parser,))
    return parser


PASSTHROUGH_RUNNERS: dict[str, Callable[[Sequence[str]], int]] = {
    "manage": run_manage,
    "worker": run_worker,
    "beat": run_beat,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    from django.core.exceptions import ImproperlyConfigured

    try:
        return _run(args)
    except ImproperlyConfigured as e:
        # A setting from the environment that cannot be used (DATABASE_URL, a number, a
        # log level): one line naming it, as for a bad argument, not a traceback.
        command = " ".join(["shunter", *args[:1]])
        print(f"{command}: configuration error: {e}", file=sys.stderr)
        return 2


def _run(args: list[str]) -> int:
    if args and args[0] in PASSTHROUGH_RUNNERS:
        if args[0] != "manage":
            _setup_django()
        return PASSTHROUGH_RUNNERS[args[0]](args[1:])
    parser = build_parser()
    ns = parser.parse_args(args)
    if ns.command is None:
        parser.print_help()
        return 2
    result: int = ns.func(ns)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
