"""Tiny model directories (written once per session) and a paged generation loop."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.engine.exec.batch import ForwardBatch, SequenceChunk
from shunter.engine.exec.loader import load_model
from shunter.engine.exec.model import Transformer, kv_block_shape

# Everything loads from local directories; a test must never reach a hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

TINY = ("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "tiny-mixtral", "tiny-qwen3-moe")
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


# Layers of the models that lend some (a model keeps two).
NUM_LAYERS = 12


@pytest.fixture(scope="module")
def deep_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny models with enough layers to lend some."""
    root = tmp_path_factory.mktemp("deep")
    dirs = {}
    for preset in ("tiny-llama", "tiny-qwen2"):
        config = preset_config(preset) | {"num_hidden_layers": NUM_LAYERS}
        dirs[preset] = init_model_dir(root / preset, config=config, seed=3)
    return dirs


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


SENTENCEPIECE_CORPUS = [
    "The shunter moves cars between the tracks of the yard.",
    "It sorts the cars by destination and builds new trains.\nEach train waits for a signal.",
    "Le train arrive en gare à huit heures.",
    "列车进站了。调度员看着信号灯。",
]


@pytest.fixture(scope="session")
def sentencepiece() -> Tokenizer:
    """A SentencePiece-style tokenizer as Llama 2 and Mistral ship it (``tokenizer.json``
    of the Llama converter): BPE over ``▁``-spaced text with byte fallback, ids 0-2 for
    ``<unk> <s> </s>``, then the 256 ``<0xNN>`` byte tokens, then the trained pieces,
    which start a word with ``▁`` and never span two.
    Trained here on a few sentences, so most characters outside them fall back to bytes.
    """
    trained = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first", split=True
    )
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    trained.train_from_iterator(SENTENCEPIECE_CORPUS, trainer=trainer)
    spec = json.loads(trained.to_str())
    # The byte tokens are ordinary vocabulary, not added tokens, right after the specials.
    pieces = sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])
    specials, rest = pieces[:3], [piece for piece, _ in pieces[3:]]
    vocab = [piece for piece, _ in specials] + [f"<0x{b:02X}>" for b in range(256)] + rest
    spec["model"]["vocab"] = {piece: i for i, piece in enumerate(vocab)}
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    return tokenizer
