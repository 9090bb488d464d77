"""``shunter engine``: serve models over HTTP. Only argparse at import time."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from shunter.engine.exec.cli import add_bench_arguments, byte_count, print_report  # argparse only


def add_engine_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "engine",
        help="serve models over an OpenAI-compatible HTTP API",
        description="Run one engine process serving every given model from one device: "
        "/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, "
        "/admin/state and /admin/drain. With a token (--token or SHUNTER_ENGINE_TOKEN) "
        "every route but /health needs 'Authorization: Bearer TOKEN'.",
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
    p.add_argument("--token", help="bearer token (default: $SHUNTER_ENGINE_TOKEN)")
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
        type=int,
        help="KV tokens per model (with --hbm-budget: only the default host swap space)",
    )
    p.add_argument("--grace", type=float, help="seconds in-flight requests get on SIGTERM")
    p.add_argument(
        "--remap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lend idle models' weight layers to the KV cache (Oneiros; default: the "
        "config's remap, else off)",
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

    from shunter.engine.exec.generate import available_device
    from shunter.engine.exec.generate_input import GenerateError
    from shunter.engine.server.app import build_app
    from shunter.engine.server.serve import build_state
    from shunter.engine.server.settings import SettingsError, check_model_dirs, load_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
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
            )
            if value is not None
        }
        settings = dataclasses.replace(settings, **overrides)
        check_model_dirs(settings)
        device = available_device(settings.device)
        token = ns.token or os.environ.get("SHUNTER_ENGINE_TOKEN") or None
        state = build_state(settings, device, token=token, check_integrity=ns.check_integrity)
    except (SettingsError, GenerateError) as e:
        print(f"shunter engine: {e}", file=sys.stderr)
        return 2
    app = build_app(state)
    names = ", ".join(f"{n} ({m.arg.sharing})" for n, m in state.models.items())
    print(f"shunter engine: serving {names} on http://{ns.host}:{ns.port}", flush=True)
    web.run_app(
        app,
        host=ns.host,
        port=ns.port,
        print=None,
        handler_cancellation=True,
        shutdown_timeout=settings.grace_s + 5,
    )
    return 0


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
        type=lambda text: tuple(int(v) for v in text.split(",")),
        default=(1, 32),
        help="comma list of concurrent streams (default 1,32)",
    )
    p.add_argument("--requests", type=int, default=32, help="requests per run (default 32)")
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
