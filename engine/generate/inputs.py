"""What ``shunter generate`` is asked to run: model directories and requests.

Pure parsing and checks, no torch: every mistake becomes a ``ServeError`` whose
message names the flag, file line or request at fault.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shunter.engine.errors import ServeError

REQUEST_FIELDS = ("model", "prompt_ids", "prompt", "max_tokens")


@dataclass(frozen=True)
class GenerateRequest:
    """One request as given; ``where`` names it in messages (``FILE:LINE`` or ``#i``)."""

    model: str
    prompt_ids: tuple[int, ...] | None
    prompt: str | None
    max_tokens: int
    where: str


def parse_model_arg(value: str) -> tuple[str, Path]:
    """``NAME=DIR`` or ``DIR`` (named after the directory)."""
    name, sep, rest = value.partition("=")
    if sep and name and os.sep not in name:
        return name, Path(rest)
    path = Path(value)
    return path.resolve().name, path


def check_model_dirs(models: Sequence[tuple[str, Path]]) -> dict[str, Path]:
    names = [name for name, _ in models]
    if len(set(names)) != len(names):
        raise ServeError(f"model names must be unique, got {names}; use --model NAME=DIR")
    for name, path in models:
        if not path.is_dir():
            raise ServeError(f"model {name!r}: directory {path} does not exist")
        for file in ("config.json", "tokenizer.json"):
            if not (path / file).is_file():
                raise ServeError(f"model {name!r}: {path} has no {file}")
    return dict(models)


def read_requests(
    path: Path, models: Sequence[str], default_max_tokens: int
) -> list[GenerateRequest]:
    """The requests of a JSON Lines file, one object per line (blank lines skipped)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ServeError(f"cannot read {path}: {e.strerror}") from None
    requests = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ServeError(f"{where}: not valid JSON: {e.msg} (column {e.colno})") from None
        requests.append(_request(item, where, models, default_max_tokens))
    if not requests:
        raise ServeError(f"{path} holds no requests")
    return requests


def _request(
    item: object, where: str, models: Sequence[str], default_max_tokens: int
) -> GenerateRequest:
    if not isinstance(item, dict):
        raise ServeError(f"{where}: expected a JSON object")
    unknown = sorted(set(item) - set(REQUEST_FIELDS))
    if unknown:
        raise ServeError(f"{where}: unknown fields {unknown}; expected {list(REQUEST_FIELDS)}")
    model = item.get("model")
    if model is None and len(models) == 1:
        model = models[0]
    if not isinstance(model, str) or model not in models:
        known = ", ".join(models)
        raise ServeError(f"{where}: unknown model {model!r}; --model gives {known}")
    if ("prompt_ids" in item) == ("prompt" in item):
        raise ServeError(f"{where}: give exactly one of prompt_ids and prompt")
    ids = item.get("prompt_ids")
    if ids is not None and not (
        isinstance(ids, list) and all(type(t) is int and t >= 0 for t in ids)
    ):
        raise ServeError(f"{where}: prompt_ids must be a list of token ids (ints >= 0)")
    prompt = item.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise ServeError(f"{where}: prompt must be a string")
    max_tokens = item.get("max_tokens", default_max_tokens)
    if type(max_tokens) is not int or max_tokens <= 0:
        raise ServeError(f"{where}: max_tokens must be a positive integer")
    return GenerateRequest(model, None if ids is None else tuple(ids), prompt, max_tokens, where)


def prompt_requests(
    models: Sequence[str], *, text: str | None, ids: Sequence[int] | None, max_tokens: int
) -> list[GenerateRequest]:
    """The one prompt, as a request to each model."""
    return [
        GenerateRequest(m, None if ids is None else tuple(ids), text, max_tokens, f"#{i}")
        for i, m in enumerate(models)
    ]
