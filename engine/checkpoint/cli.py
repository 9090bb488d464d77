"""``shunter model init``'s command line. Only argparse and the catalog at import time:
torch loads when the command runs, so ``shunter --help`` stays fast."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from shunter.engine.catalog import DEFAULT_SHARD_BYTES, PRESETS  # no torch


def add_model_parser(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``model`` and its action ``init``: a model directory with random weights."""
    model = sub.add_parser("model", help="model directories in Hugging Face format")
    actions = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    init = actions.add_parser(
        "init", help="write a model directory with random weights and a local tokenizer"
    )
    source = init.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", choices=sorted(PRESETS), help="a built-in architecture")
    source.add_argument("--config", type=Path, help="a Hugging Face config.json to follow")
    init.add_argument("--out", type=Path, required=True, help="directory to write (new or empty)")
    init.add_argument("--seed", type=int, default=0, help="seed of the weights (default 0)")
    init.add_argument(
        "--layers",
        type=int,
        help="decoder layers instead of the config's (num_hidden_layers)",
    )
    init.add_argument(
        "--shard-bytes",
        type=int,
        default=DEFAULT_SHARD_BYTES,
        help=f"largest safetensors file before sharding (default {DEFAULT_SHARD_BYTES})",
    )
    init.set_defaults(func=cmd_model_init)


def cmd_model_init(ns: argparse.Namespace) -> int:
    from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config

    config = preset_config(ns.preset) if ns.preset else json.loads(ns.config.read_text())
    if ns.layers is not None:
        if ns.layers < 1:
            print("shunter model init: --layers must be at least 1", file=sys.stderr)
            return 2
        config["num_hidden_layers"] = ns.layers
    out = init_model_dir(ns.out, config=config, seed=ns.seed, max_shard_bytes=ns.shard_bytes)
    print(f"wrote {out}")
    return 0
