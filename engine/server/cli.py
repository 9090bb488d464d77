"""``shunter engine``: serve models over HTTP. Only argparse at import time."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from shunter.engine.cliargs import (  # argparse only
    add_bench_arguments,
    byte_count,
    comma_ints,
    non_negative_float,
    positive_float,
    positive_int,
    print_report,
)

TOKEN_ENV = "SHUNTER_ENGINE_TOKEN"
METRICS_TOKEN_ENV = "SHUNTER_METRICS_TOKEN"
# What anyone who reaches the port may use when the engine runs without a token.
OPEN_ROUTES = "/v1/* (completions), /admin/* (state, drain, deployments) and /metrics"


def add_engine_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "engine",
        help="serve models over an OpenAI-compatible HTTP API",
        description="Run one engine process serving every given model from one device: "
        "/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, "
        "/admin/state and /admin/drain. With a token ($SHUNTER_ENGINE_TOKEN, --token-file "
        "or --token) every route but /health needs 'Authorization: Bearer TOKEN'; without "
        "one every route is open.",
    )
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=DIR[:temporal|spatial]",
        help="a model directory served as NAME with its sharing mode (default spatial); repeatable",
    )
    p.add_argument("--config", type=Path, help="a TOML file (see deploy/engine.toml)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=8100, help="port (default 8100)")
    secret = p.add_mutually_exclusive_group()
    secret.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help=f"read the bearer token from this file (default: ${TOKEN_ENV})",
    )
    secret.add_argument(
        "--token",
        help="bearer token; visible to every user in the process list: prefer "
        f"${TOKEN_ENV} or --token-file",
    )
    scrape = p.add_mutually_exclusive_group()
    scrape.add_argument(
        "--metrics-token-file",
        type=Path,
        metavar="PATH",
        help="a second bearer token that opens /metrics alone, for a Prometheus scraper "
        f"(default: ${METRICS_TOKEN_ENV})",
    )
    scrape.add_argument(
        "--open-metrics",
        action="store_true",
        help="serve /metrics without a token (only where the port is not reachable from outside)",
    )
    p.add_argument(
        "--hbm-budget",
        type=byte_count,
        metavar="BYTES",
        help="arena bytes on the device: weights plus KV (e.g. 40G)",
    )
    p.add_argument(
        "--host-budget",
        type=byte_count,
        metavar="BYTES",
        help="host memory for swapped-out KV, one budget shared by the models (e.g. 64G; "
        "default: --kv-tokens tokens of each model, within half the host's memory); on "
        "CUDA each model pins a buffer of this size",
    )
    p.add_argument(
        "--kv-tokens",
        type=positive_int,
        help="KV tokens per model (with --hbm-budget: only the default host swap space)",
    )
    p.add_argument(
        "--grace", type=non_negative_float, help="seconds in-flight requests get on SIGTERM"
    )
    p.add_argument(
        "--step-target-ms",
        type=positive_float,
        help="the time a step should take; prefill is chunked to fit it (default: half "
        "the tightest TBT SLO of the served models)",
    )
    p.add_argument(
        "--remap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lend idle models' weight layers to the KV cache (Oneiros; default: the "
        "config's remap, else off)",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="share the KV of prompts' common prefixes between requests of a model "
        "(default: the config's prefix_caching, else on)",
    )
    p.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="plan each step while the previous one runs, as vLLM's flag of that name "
        "(default: the config's async_scheduling, else off)",
    )
    p.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run decode steps eagerly, without CUDA graphs, as vLLM's flag of that name "
        "(default: the config's enforce_eager, else graphs on CUDA)",
    )
    p.add_argument(
        "--check-integrity",
        action="store_true",
        help="debug: run the memory integrity check after every step",
    )
    p.set_defaults(func=cmd_engine)


def cmd_engine(ns: argparse.Namespace) -> int:
    import dataclasses
    import logging

    from aiohttp import web

    from shunter.engine.errors import ServeError
    from shunter.engine.generate.run import available_device
    from shunter.engine.server.app import build_app
    from shunter.engine.server.serve import build_state
    from shunter.engine.server.settings import SettingsError, check_model_dirs, load_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load_settings(ns.config, ns.model)
        overrides = {
            key: value
            for key, value in (
                ("device", ns.device),
                ("hbm_budget", ns.hbm_budget),
                ("host_budget", ns.host_budget),
                ("kv_tokens", ns.kv_tokens),
                ("grace_s", ns.grace),
                ("remap", ns.remap),
                ("prefix_caching", ns.enable_prefix_caching),
                ("async_scheduling", ns.async_scheduling),
                ("enforce_eager", ns.enforce_eager),
                ("step_target_s", None if ns.step_target_ms is None else ns.step_target_ms / 1000),
            )
            if value is not None
        }
        settings = dataclasses.replace(settings, **overrides)
        check_model_dirs(settings)
        check_port(ns.host, ns.port)  # before the models load, which takes a while
        device = available_device(settings.device)
        token = engine_token(ns)
        state = build_state(
            settings,
            device,
            token=token,
            metrics_token=metrics_token(ns),
            open_metrics=ns.open_metrics,
            check_integrity=ns.check_integrity,
        )
    except (SettingsError, ServeError) as e:
        print(f"shunter engine: {e}", file=sys.stderr)
        return 2
    app = build_app(state)
    names = ", ".join(f"{n} ({m.arg.sharing})" for n, m in state.models.items())
    print(f"shunter engine: serving {names} on http://{ns.host}:{ns.port}", flush=True)
    try:
        web.run_app(
            app,
            host=ns.host,
            port=ns.port,
            print=None,
            handler_cancellation=True,
            shutdown_timeout=settings.grace_s + 5,
        )
    except OSError as e:  # taken since the check: the app's cleanup has stopped the engine
        print(
            f"shunter engine: cannot listen on {ns.host}:{ns.port}: {e.strerror}", file=sys.stderr
        )
        return 1
    return 0


def check_port(host: str, port: int) -> None:
    """SettingsError when ``host``:``port`` cannot be listened on (another process holds
    it, or the address is not this host's)."""
    import socket

    from shunter.engine.server.settings import SettingsError

    try:  # a name that does not resolve (gaierror) is an OSError too
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in infos:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
                sock.bind(address)
    except OSError as e:
        raise SettingsError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def engine_token(ns: argparse.Namespace) -> str | None:
    """The engine's bearer token: ``--token-file``'s contents (without the line end),
    else ``--token``, else ``$SHUNTER_ENGINE_TOKEN``; None for none. Logs a warning when
    the token is on the command line (the process list shows it) and when there is none
    (every route is open). SettingsError: an unreadable file, or a token that cannot go
    in an HTTP header (printable ASCII without spaces)."""
    import logging

    log = logging.getLogger("shunter.engine.server")
    token: str
    if ns.token_file is not None:
        token = _read_token(ns.token_file)
    elif ns.token:
        token = ns.token
        log.warning(
            "the engine token was given with --token: every user of this host can read it "
            "in the process list; use $%s or --token-file instead",
            TOKEN_ENV,
        )
    else:
        token = os.environ.get(TOKEN_ENV, "")
    if not token:
        log.warning(
            "no engine token ($%s, --token-file): anyone who reaches this port may use "
            "%s without authentication",
            TOKEN_ENV,
            OPEN_ROUTES,
        )
        return None
    return _header_token(token, "engine token")


def metrics_token(ns: argparse.Namespace) -> str | None:
    """The scrape token: ``--metrics-token-file``'s contents, else
    ``$SHUNTER_METRICS_TOKEN``; None for none (``/metrics`` takes the engine token)."""
    if ns.metrics_token_file is not None:
        token = _read_token(ns.metrics_token_file)
    else:
        token = os.environ.get(METRICS_TOKEN_ENV, "")
    return _header_token(token, "metrics token") if token else None


def _header_token(token: str, what: str) -> str:
    """``token`` when it can go in an HTTP header; SettingsError naming ``what`` else."""
    from shunter.engine.api.tokens import TOKEN_RULE, is_header_token
    from shunter.engine.server.settings import SettingsError

    if not is_header_token(token):
        raise SettingsError(f"the {what} must be {TOKEN_RULE}")
    return token


def _read_token(path: Path) -> str:
    """A token file's contents without the line end; SettingsError when it cannot be
    read or is empty."""
    from shunter.engine.server.settings import SettingsError

    try:
        token = path.read_text().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as e:
        raise SettingsError(f"cannot read the token file {path}: {e}") from None
    if not token:
        raise SettingsError(f"the token file {path} is empty")
    return token


def add_bench_server_parser(benches: argparse._SubParsersAction[Any]) -> None:
    """Add ``bench server``: TTFT and ITL through the HTTP server against in-process."""
    p = benches.add_parser(
        "server",
        help="CPU: TTFT and ITL through the HTTP server against the same requests in-process",
        description="Write tiny-llama (random weights) to a temporary directory unless "
        "--model names one, then run the same greedy requests in-process (TorchEngine) and "
        "as streaming /v1/completions requests through a server on a loopback port, at "
        "each concurrency of --streams. Host wall time on this machine.",
    )
    add_bench_arguments(
        p, preset="tiny-llama", prompt_tokens=64, max_tokens=32, threads=1, rounds=3
    )
    p.add_argument(
        "--streams",
        type=comma_ints,
        default=(1, 32),
        help="comma list of concurrent streams (default 1,32)",
    )
    p.add_argument(
        "--requests", type=positive_int, default=32, help="requests per run (default 32)"
    )
    p.set_defaults(func=cmd_bench_server)


def cmd_bench_server(ns: argparse.Namespace) -> int:
    from shunter.engine.server.bench import bench_server

    return print_report(
        bench_server(
            model_dir=ns.model,
            streams=ns.streams,
            requests=ns.requests,
            prompt_tokens=ns.prompt_tokens,
            max_tokens=ns.max_tokens,
            threads=ns.threads,
            rounds=ns.rounds,
        )
    )


def add_bench_prefix_parser(benches: argparse._SubParsersAction[Any]) -> None:
    """Add ``bench prefix``: TTFT and prefill work with prefix caching on and off."""
    p = benches.add_parser(
        "prefix",
        help="CPU: document-QA and multi-turn chat TTFT with prefix caching on and off",
        description="Write tiny-llama (random weights, a context of twice --doc-tokens) "
        "to a temporary directory unless --model names one, then send a document-QA and "
        "a multi-turn chat workload to two `shunter engine` processes, prefix caching on "
        "and off. Prints TTFT p50/p90 and the prompt tokens each engine computed. Host "
        "wall time on this machine.",
    )
    add_bench_arguments(p, preset="tiny-llama", max_tokens=16, threads=1, rounds=3)
    for flag, default, meaning in (
        ("--documents", 4, "documents"),
        ("--questions", 4, "questions per document"),
        ("--doc-tokens", 4096, "tokens per document"),
        ("--question-tokens", 32, "tokens per question or chat message"),
        ("--conversations", 4, "chat conversations"),
        ("--turns", 4, "turns per conversation"),
        ("--system-tokens", 1024, "tokens of the chat's shared system prompt"),
        ("--concurrency", 2, "document-QA requests at a time"),
    ):
        p.add_argument(
            flag, type=positive_int, default=default, help=f"{meaning} (default {default})"
        )
    p.add_argument("--json", type=Path, metavar="FILE", help="write the figure to FILE")
    p.set_defaults(func=cmd_bench_prefix)


def cmd_bench_prefix(ns: argparse.Namespace) -> int:
    from shunter.engine.server.bench_prefix import bench_prefix

    return print_report(
        bench_prefix(
            model_dir=ns.model,
            documents=ns.documents,
            questions=ns.questions,
            doc_tokens=ns.doc_tokens,
            question_tokens=ns.question_tokens,
            conversations=ns.conversations,
            turns=ns.turns,
            system_tokens=ns.system_tokens,
            max_tokens=ns.max_tokens,
            concurrency=ns.concurrency,
            threads=ns.threads,
            rounds=ns.rounds,
        ),
        ns.json,
    )
