"""``shunter demo``: the whole platform on this machine, on the embedded default.

The pieces, in the order ``shunter demo`` runs them (``cmd_demo`` composes them):

1. ``ensure_model_dirs`` (``demo_engine``): tiny-llama and tiny-qwen2 shapes with
   ``DEMO_LAYERS`` layers (random weights) under ``var/models/``, made once.
2. ``EngineProcess.start`` (``demo_engine``): ``shunter engine`` as a child on a free
   loopback port with a fresh token, serving tiny-llama (temporal) and tiny-qwen2
   (spatial) in an arena of ``HBM_BUDGET`` bytes with remapping on, so that bursts rotate
   KV to host memory and borrow the idle temporal model's layers.
3. ``prepare`` (``demo_seed``; Django set up, the engine answering): migrate, the admin
   user (``admin_user_ensure``), ``seed_demo``, the node pointed at this run's engine, one
   reconcile and one poll; the tenants' keys go to ``var/demo/keys.json`` (mode 0600).
4. ``NodePoller`` (``demo_poller``): a thread calling the ``node_poll`` service every
   ``POLL_INTERVAL_S``, in place of Celery beat (which the embedded default does not
   run), so the node's status and memory map stay live.
5. ``LoadProcess`` (``demo_traffic``): the load generator as a child process (``python -m
   shunter.project.demo load``, its plan on stdin): each demo tenant sends bursty (gamma)
   streaming requests through the gateway with its own key, at rates a 2-core CPU keeps up
   with.
6. ``serve`` (``demo_web``): uvicorn until SIGINT or SIGTERM; the load generator is
   stopped first (so the server's graceful shutdown has no new requests to wait for), then
   the poller and the engine. Children (``demo_children``) live in their own sessions (a
   terminal's Ctrl-C reaches only the demo, which stops them in that order) and die with
   the demo if it is killed.

Run as ``python -m shunter.project.demo load``, this module is the load generator child.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from shunter.project.demo_children import DemoError
from shunter.project.demo_engine import DEMO_LAYERS, MODELS, EngineProcess, ensure_model_dirs
from shunter.project.demo_paths import DemoPaths
from shunter.project.demo_poller import NodePoller
from shunter.project.demo_seed import prepare, use_wal
from shunter.project.demo_traffic import LOAD, LoadProcess, load_main
from shunter.project.demo_web import local_url, serve

__all__ = [
    "DEMO_LAYERS",
    "LOAD",
    "MODELS",
    "DemoError",
    "DemoPaths",
    "EngineProcess",
    "LoadProcess",
    "NodePoller",
    "ensure_model_dirs",
    "local_url",
    "prepare",
    "serve",
    "use_wal",
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shunter.project.demo")
    parser.add_argument("role", choices=("load",), help="load: the demo's load generator")
    parser.parse_args(argv)
    return load_main(sys.stdin)


if __name__ == "__main__":
    raise SystemExit(main())
