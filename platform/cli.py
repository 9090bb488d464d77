"""The ``shunter`` command.

``shunter manage ...``, ``shunter worker ...`` and ``shunter beat ...`` pass their
arguments through to Django and Celery; the other subcommands are parsed here.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

SETTINGS = "shunter.platform.settings"

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
    from shunter.platform.celery import app

    app.worker_main(["worker", "--loglevel=INFO", *args])
    return 0


def run_beat(args: Sequence[str]) -> int:
    from django.conf import settings

    from shunter.platform.celery import app

    schedule = settings.VAR_DIR / "celerybeat-schedule"
    schedule.parent.mkdir(parents=True, exist_ok=True)
    app.start(["beat", "--loglevel=INFO", f"--schedule={schedule}", *args])
    return 0


def serve(host: str, port: int, *, log_level: str = "info") -> None:
    """Serve the ASGI application (HTTP and websockets) until interrupted."""
    import uvicorn

    uvicorn.run(
        "shunter.platform.asgi:application",
        host=host,
        port=port,
        log_level=log_level,
        proxy_headers=True,
        forwarded_allow_ips=os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1"),
        lifespan="off",
    )


def cmd_web(ns: argparse.Namespace) -> int:
    serve(ns.host, ns.port, log_level=ns.log_level)
    return 0


def cmd_demo(ns: argparse.Namespace) -> int:
    """Bring the platform up on the embedded default and serve it."""
    # The embedded default: local development settings unless the caller chose otherwise.
    os.environ.setdefault("DEBUG", "1")
    os.environ.setdefault("SHUNTER_HTTPS", "0")
    _setup_django()
    from django.conf import settings
    from django.core.management import call_command

    from shunter.platform import runtime
    from shunter.platform.services import admin_user_ensure

    call_command("migrate", interactive=False, verbosity=0)
    info = runtime.describe()
    print(
        f"database: {info.database}, channel layer: {info.channel_layer}, "
        f"tasks: {info.task_mode}, data in {settings.VAR_DIR}"
    )
    ensured = admin_user_ensure(
        username=ns.admin_user, password=os.environ.get("SHUNTER_ADMIN_PASSWORD") or None
    )
    if ensured.password is not None and not os.environ.get("SHUNTER_ADMIN_PASSWORD"):
        print(f"admin user: {ns.admin_user}  password: {ensured.password}  (shown once)")
    elif ensured.password is not None:
        print(f"admin user: {ns.admin_user}  password: from SHUNTER_ADMIN_PASSWORD")
    else:
        print(f"admin user: {ns.admin_user} (exists; set SHUNTER_ADMIN_PASSWORD to reset it)")
    if ns.no_serve:
        return 0
    print(f"serving http://{ns.host}:{ns.port}/  (admin: /admin/, Ctrl-C to stop)", flush=True)
    serve(ns.host, ns.port)
    return 0


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
        "demo", help="migrate the embedded default, ensure an admin user, and serve"
    )
    demo.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    demo.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    demo.add_argument(
        "--admin-user",
        default=os.environ.get("SHUNTER_ADMIN_USER", "admin"),
        help="admin user name (default: $SHUNTER_ADMIN_USER or admin)",
    )
    demo.add_argument("--no-serve", action="store_true", help="prepare everything, then exit")
    demo.set_defaults(func=cmd_demo)

    from shunter.engine.cli import register as register_engine_commands

    register_engine_commands(sub)
    return parser


PASSTHROUGH_RUNNERS: dict[str, Callable[[Sequence[str]], int]] = {
    "manage": run_manage,
    "worker": run_worker,
    "beat": run_beat,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
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
