"""``shunter generate``'s command line.

Only argparse and pure engine logic at import time: torch and the models load when the
command runs, so ``shunter --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from shunter.engine.cliargs import byte_count, non_negative_int, positive_float, positive_int
from shunter.engine.exec.forced_remap import EVERY_LAYER


def _token_ids(text: str) -> list[int]:
    try:
        ids = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected token ids such as 1,2,3: {text!r}") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"expected token ids >= 0 such as 1,2,3: {text!r}")
    return ids


def add_generate_parser(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``generate``: serve prompts offline through EngineCore and the torch executor."""
    p = sub.add_parser(
        "generate",
        help="generate tokens offline with the engine (real models, no server)",
        description="Run the engine core with the torch executor over Hugging Face model "
        "directories and print each request's tokens and text. A prompt given with "
        "--prompt or --prompt-ids goes to every model; --requests runs a JSON Lines file "
        '(one {"model", "prompt_ids" or "prompt", "max_tokens"} object per line) with '
        "all requests concurrent.",
    )
    p.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="[NAME=]DIR",
        help="a model directory, named NAME (default: the directory's name); repeatable",
    )
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", metavar="TEXT", help="a text prompt, tokenized per model")
    prompt.add_argument(
        "--prompt-ids", type=_token_ids, metavar="1,2,3", help="a prompt as token ids"
    )
    prompt.add_argument(
        "--requests", type=Path, metavar="FILE.jsonl", help="one JSON request per line"
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        required=True,
        metavar="N",
        help="output tokens per request (--requests: for lines without max_tokens)",
    )
    sampling = p.add_mutually_exclusive_group()
    sampling.add_argument("--greedy", action="store_true", help="always the most likely token")
    sampling.add_argument(
        "--temperature",
        type=positive_float,
        default=1.0,
        metavar="T",
        help="sampling temperature (default 1.0)",
    )
    p.add_argument("--seed", type=int, metavar="S", help="seed of every request's sampler")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="where the models run (default: cuda when available, else cpu)",
    )
    p.add_argument(
        "--hbm-budget",
        type=byte_count,
        metavar="BYTES",
        help="device arena size: weights plus KV (e.g. 500M); default: room for every "
        "request at full length. Pages are 2 MiB, or the largest KV block rounded up to a "
        "power of two when smaller",
    )
    p.add_argument(
        "--force-rotation",
        action="store_true",
        help="rotate requests' KV to host and back after every step they run, and copy "
        "every full block to host at once",
    )
    p.add_argument(
        "--remap",
        action="store_true",
        help="lend decoder layers' weight memory to the KV cache under memory pressure "
        "(parameter remapping): their layers stream from host memory during forward passes",
    )
    p.add_argument(
        "--force-remap",
        nargs="?",
        const=EVERY_LAYER,
        type=non_negative_int,
        metavar="N",
        help="remap N layers of every model whatever the pressure (without N: all it can), "
        "at most its layers less 2, so a 2-layer model lends none; implies --remap",
    )
    p.add_argument(
        "--force-remap-inactive",
        action="store_true",
        help="with --force-remap: only models not executing (temporal models without "
        "the turn) lend their layers",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action="store_true",
        help="share the KV of prompts' common prefixes between requests (the summary "
        "counts prompt tokens looked up and found)",
    )
    p.add_argument(
        "--async-scheduling",
        action="store_true",
        help="plan each step while the previous one runs (the host's planning and "
        "output handling leave the critical path)",
    )
    p.add_argument(
        "--enforce-eager",
        action="store_true",
        help="run decode steps eagerly, without CUDA graphs (CUDA devices only)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print JSON lines: one object per request in input order, then a summary",
    )
    p.set_defaults(func=cmd_generate)


def cmd_generate(ns: argparse.Namespace) -> int:
    from shunter.engine.errors import ServeError
    from shunter.engine.generate.run import format_json, format_text, generate_from_args

    try:
        result = generate_from_args(ns)
    except ServeError as e:
        print(f"shunter generate: error: {e}", file=sys.stderr)
        return 2
    for warning in result.warnings:
        print(f"shunter generate: warning: {warning}", file=sys.stderr)
    for line in (format_json if ns.json else format_text)(result):
        print(line)
    return 0
