"""JSONL traces: one request a line, its arrival time and lengths. The simulator writes
them (``write_trace``) and replays them (``read_trace``, ``load_trace``); the load
generator sends them (``trace_workload``), so a simulated workload replays against a
real server. ``trace_rows`` is the one reader of the format."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shunter.engine.workload.requests import RequestSpec, WorkloadError, WorkloadRequest
from shunter.engine.workload.sources import TraceWorkload
from shunter.engine.workload.tokens import TokenCounter, estimate_tokens, synthetic_prompt


def write_trace(path: str | Path, requests: Iterable[WorkloadRequest]) -> None:
    """Write one ``{"t", "prompt_tokens", "output_tokens", "model"}`` object per line."""
    with Path(path).open("w") as f:
        for r in requests:
            row = {
                "t": r.t,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "model": r.model,
            }
            f.write(json.dumps(row) + "\n")


@dataclass(frozen=True)
class TraceRow:
    """One line of a JSONL trace: arrival ``t`` (seconds), ``output_tokens``, and the
    prompt as text, as a token count or both; ``model`` where the trace names one.
    ``where`` is ``path:line`` for messages."""

    where: str
    t: float
    output_tokens: int
    prompt_tokens: int | None = None
    prompt: str | None = None
    model: str | None = None


def trace_rows(path: str | Path) -> list[TraceRow]:
    """Every request of a JSONL trace in file order, blank lines skipped: the one reader
    of the format the simulator writes (``write_trace``) and the load generator replays.
    ValueError naming the line for a malformed one, or for a file that cannot be read."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from None
    return [
        _trace_row(f"{path}:{lineno}", line)
        for lineno, line in enumerate(lines, start=1)
        if line.strip()
    ]


def _trace_row(where: str, line: str) -> TraceRow:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object")
    t = row.get("t")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
        raise ValueError(f"{where}: 't' must be a non-negative number of seconds")
    output = _positive_int(where, row, "output_tokens")
    if output is None:
        raise ValueError(f"{where}: 'output_tokens' must be a positive integer")
    prompt = row.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise ValueError(f"{where}: 'prompt' must be a non-empty string")
    model = row.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"{where}: 'model' must be a string")
    return TraceRow(
        where, float(t), output, _positive_int(where, row, "prompt_tokens"), prompt, model
    )


def _positive_int(where: str, row: dict[str, Any], key: str) -> int | None:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: '{key}' must be a positive integer")
    return value


def read_trace(path: str | Path) -> list[WorkloadRequest]:
    """A JSONL trace's requests sorted by arrival time; each line needs ``t``,
    ``prompt_tokens``, ``output_tokens`` and ``model`` (ValueError naming the line)."""
    requests = []
    for row in trace_rows(path):
        if row.prompt_tokens is None or row.model is None:
            raise ValueError(f"{row.where}: bad trace line: needs 'prompt_tokens' and 'model'")
        requests.append(WorkloadRequest(row.t, row.prompt_tokens, row.output_tokens, row.model))
    return sorted(requests, key=lambda r: r.t)


def load_trace(path: str | Path, models: Collection[str]) -> list[WorkloadRequest]:
    """``read_trace`` for a run serving ``models``: ValueError for a file that cannot be
    read, a trace without requests, or one naming a model the run does not serve."""
    try:
        requests = read_trace(path)
    except ValueError as exc:
        raise ValueError(f"cannot read trace {path}: {exc}") from None
    if not requests:
        raise ValueError(f"trace {path} has no requests")
    unknown = sorted({r.model for r in requests} - set(models))
    if unknown:
        raise ValueError(
            f"trace {path} names {', '.join(unknown)}, not served in this run "
            f"(models: {', '.join(models)})"
        )
    return requests


def trace_window(requests: Sequence[WorkloadRequest]) -> tuple[float, float]:
    """A trace's arrival window (seconds up to its last arrival) and its mean rate of
    arrivals over that window (requests per second)."""
    window = max(r.t for r in requests)
    return window, len(requests) / window if window > 0 else float(len(requests))


def trace_workload(
    path: str | Path, count: TokenCounter | None = None, *, seed: int = 0
) -> TraceWorkload:
    """Requests with arrival times from a JSONL file, one object per line.

    Each line holds ``t`` (arrival, seconds), ``output_tokens`` and either ``prompt``
    (text) or ``prompt_tokens`` (a synthetic prompt of that many words is made, seeded by
    ``seed``); both may be given. This is the simulator's trace format (``write_trace``),
    so a simulated workload replays against a real server; its ``model`` key is ignored
    (the target names the model). Blank lines are skipped; times are sorted and shifted
    so the first arrival is at 0.
    """
    rng = random.Random(seed)
    count = count or estimate_tokens
    try:
        rows = [_request(row, count, rng) for row in trace_rows(path)]
    except ValueError as exc:
        raise WorkloadError(str(exc)) from None
    if not rows:
        raise WorkloadError(f"{path}: the trace has no requests")
    rows.sort(key=lambda r: r.t or 0.0)
    t0 = rows[0].t or 0.0
    specs = tuple(RequestSpec(r.prompt, r.input_len, r.output_len, (r.t or 0.0) - t0) for r in rows)
    return TraceWorkload(specs, f"trace:{Path(path).name}")


def _request(row: TraceRow, count: TokenCounter, rng: random.Random) -> RequestSpec:
    """A trace row as a request: its prompt text, else a synthetic prompt of its token
    count; its length the given count, else the text's."""
    prompt = row.prompt
    if prompt is None:
        if row.prompt_tokens is None:
            raise ValueError(f"{row.where}: needs 'prompt' or 'prompt_tokens'")
        prompt = synthetic_prompt(row.prompt_tokens, rng)
    input_len = row.prompt_tokens if row.prompt_tokens is not None else count(prompt)
    return RequestSpec(prompt, input_len, row.output_tokens, row.t)
