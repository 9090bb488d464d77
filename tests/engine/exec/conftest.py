"""Tiny model directories (written once per session) and a paged generation loop."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from shunter.engine.exec.batch import ForwardBatch, SequenceChunk
from shunter.engine.exec.loader import load_model
from shunter.engine.exec.model import Transformer, kv_block_shape
from shunter.engine.exec.model_init import init_model_dir, preset_config

# Everything loads from local directories; a test must never reach a hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

TINY = ("tiny-llama", "tiny-qwen2", "tiny-mistral")
CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run faster on one thread: a thread pool costs more than it gives
    on 64-wide matrices, much more so on a shared, busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {name: init_model_dir(root / name, config=preset_config(name), seed=0) for name in TINY}


def transformer(model_dir: Path) -> Transformer:
    loaded = load_model(model_dir, device=CPU)
    return Transformer(loaded.arch, loaded.weights)


def new_cache(model: Transformer, num_blocks: int, block_tokens: int) -> torch.Tensor:
    shape = (num_blocks, *kv_block_shape(model.arch, block_tokens))
    return torch.zeros(shape, dtype=model.dtype, device=model.device)


def greedy_generate(
    model: Transformer,
    prompt: Sequence[int],
    num_tokens: int,
    *,
    block_tokens: int = 4,
    prefill_chunk: int = 1 << 30,
    banned: Sequence[int] = (),
) -> list[int]:
    """Greedy tokens of one sequence through the paged forward pass, never ``banned``.

    Blocks are handed out in reverse order so that the table is not the identity.
    """
    total = len(prompt) + num_tokens
    num_blocks = -(-total // block_tokens)
    table = list(reversed(range(num_blocks)))
    cache = new_cache(model, num_blocks, block_tokens)
    tokens = list(prompt)
    done = 0
    while len(tokens) < total:
        chunk = tokens[done : done + prefill_chunk]
        batch = ForwardBatch.build(
            [SequenceChunk(chunk, done, table, samples=done + len(chunk) == len(tokens))],
            block_tokens=block_tokens,
            device=model.device,
            sliding_window=model.arch.sliding_window,
        )
        logits = model.forward(batch, cache)
        done += len(chunk)
        if done == len(tokens):
            ban = torch.tensor(banned, dtype=torch.int64)
            tokens.append(int(logits[0].index_fill(0, ban, float("-inf")).argmax()))
    return tokens[len(prompt) :]
