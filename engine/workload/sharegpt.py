"""ShareGPT-format files: each conversation's first exchange, read as token-count pairs
for the simulator (``sharegpt_lengths``) or as requests for the load generator
(``sharegpt_workload``), both under vLLM's length filter."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shunter.engine.workload.lengths import (
    MAX_PROMPT_TOKENS,
    MAX_TOTAL_TOKENS,
    MIN_TOKENS,
    sharegpt_like,
)
from shunter.engine.workload.requests import RequestSpec, WorkloadError
from shunter.engine.workload.sources import SampledWorkload
from shunter.engine.workload.tokens import TokenCounter, estimate_tokens

# The roles a ShareGPT turn of the user has, in the original dump and in later copies.
SHAREGPT_HUMAN = ("human", "user")


def sharegpt_exchanges(path: str | Path) -> list[tuple[str, str]]:
    """The first exchange of each conversation of a ShareGPT-format JSON file.

    The file is a list of ``{"conversations": [{"from": "human"|"gpt", "value": str},
    ...]}``. A conversation's first human turn is the prompt and the turn after it, if
    not another human one, the reply; conversations without such a pair give none.
    ValueError for a file that cannot be read or parsed, or an entry of another shape
    (naming it).
    """
    data = _read_json(path)
    if not isinstance(data, list):
        raise ValueError(
            f"{path}: a ShareGPT file is a JSON list of conversations, not {type(data).__name__}"
        )
    exchanges = []
    for i, item in enumerate(data):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise ValueError(f"{path}: entry {i}: expected an object with a 'conversations' list")
        for j, turn in enumerate(turns):
            if not (
                isinstance(turn, dict)
                and isinstance(turn.get("from"), str)
                and isinstance(turn.get("value"), str)
            ):
                raise ValueError(
                    f"{path}: entry {i}, turn {j}: expected {{'from': str, 'value': str}}"
                )
        for turn, reply in itertools.pairwise(turns):
            if turn["from"] in SHAREGPT_HUMAN:
                if reply["from"] not in SHAREGPT_HUMAN:
                    exchanges.append((turn["value"], reply["value"]))
                break
    return exchanges


def _read_json(path: str | Path) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None


def sharegpt_lengths(
    path: str | Path, count_tokens: Callable[[str], int] = estimate_tokens
) -> list[tuple[int, int]]:
    """``(prompt, output)`` token counts of a ShareGPT-format file's first exchanges
    (``sharegpt_exchanges``), as SuperInfer and vLLM's benchmark take them; pairs outside
    vLLM's length filter are skipped. ``count_tokens`` counts a text's tokens (pass a
    tokenizer's; the default estimates)."""
    pairs = []
    for prompt_text, reply_text in sharegpt_exchanges(path):
        prompt, output = count_tokens(prompt_text), count_tokens(reply_text)
        if sharegpt_like.keeps(prompt, output):
            pairs.append((prompt, output))
    return pairs


def sharegpt_workload(path: str | Path, count: TokenCounter | None = None) -> SampledWorkload:
    """Requests from a ShareGPT-format JSON file (``sharegpt_exchanges``): each
    conversation's first exchange gives one request, its reply setting the output length,
    as ``vllm bench serve`` does. Exchanges outside vLLM's length filter (prompt and reply
    >= 4 tokens, prompt <= 1024, both <= 2048) are skipped; a malformed entry is an error
    naming it. ``count`` counts tokens (the target's tokenizer); without it lengths are
    estimated at four characters per token.
    """
    count = count or estimate_tokens
    try:
        exchanges = sharegpt_exchanges(path)
    except ValueError as exc:
        raise WorkloadError(str(exc)) from None
    specs = []
    for prompt, reply in exchanges:
        input_len, output_len = count(prompt), count(reply)
        if sharegpt_like.keeps(input_len, output_len):
            specs.append(RequestSpec(prompt, input_len, output_len))
    if not specs:
        raise WorkloadError(
            f"{path}: no conversation has a human turn followed by a reply within "
            f"{MIN_TOKENS}..{MAX_PROMPT_TOKENS} prompt and {MAX_TOTAL_TOKENS} total tokens"
        )
    return SampledWorkload(tuple(specs), f"sharegpt:{Path(path).name}")
