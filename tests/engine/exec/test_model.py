"""Our paged forward pass gives the logits and greedy tokens of ``transformers``."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from shunter.engine.exec.batch import ForwardBatch, SequenceChunk
from shunter.engine.exec.loader import load_model
from shunter.engine.exec.model import Transformer
from tests.engine.exec.conftest import TINY, greedy_generate, new_cache, transformer

HF_CLASSES = {
    "tiny-llama": "LlamaForCausalLM",
    "tiny-qwen2": "Qwen2ForCausalLM",
    "tiny-qwen3": "Qwen3ForCausalLM",
    "tiny-mixtral": "MixtralForCausalLM",
    "tiny-qwen3-moe": "Qwen3MoeForCausalLM",
    "tiny-mistral": "MistralForCausalLM",
}
ATOL = 1e-4


@cache
def hf_model(model_dir: Path) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


@cache
def ours(model_dir: Path) -> Transformer:
    return transformer(model_dir)


def prompt(length: int, seed: int = 0) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 500, (length,), generator=gen).tolist()


def hf_logits(model_dir: Path, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = hf_model(model_dir)(torch.tensor([ids])).logits[0]
    return logits


@pytest.mark.parametrize("name", TINY)
def test_loads_as_the_matching_transformers_class(name: str, tiny_dirs: dict[str, Path]) -> None:
    assert type(hf_model(tiny_dirs[name])).__name__ == HF_CLASSES[name]


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize(
    ("block_tokens", "chunks"),
    [
        (16, [40]),  # whole prompt at once, across two block boundaries
        (4, [7, 1, 12, 5, 15]),  # chunked prefill, chunks straddling blocks
        (1, [3, 1, 1, 35]),
        (8, [8, 8, 24]),  # chunks ending exactly on block boundaries
    ],
)
def test_chunked_prefill_logits_match_transformers(
    name: str, block_tokens: int, chunks: list[int], tiny_dirs: dict[str, Path]
) -> None:
    ids = prompt(sum(chunks))
    expected = hf_logits(tiny_dirs[name], ids)
    model = ours(tiny_dirs[name])
    num_blocks = -(-len(ids) // block_tokens) + 4
    table = list(range(num_blocks))[::-1][:-4]
    cache_ = new_cache(model, num_blocks, block_tokens)
    start = 0
    for size in chunks:
        batch = ForwardBatch.build(
            [SequenceChunk(ids[start : start + size], start, table, samples=True)],
            block_tokens=block_tokens,
            device=model.device,
            sliding_window=model.arch.sliding_window,
        )
        logits = model.forward(batch, cache_)
        start += size
        torch.testing.assert_close(logits[0], expected[start - 1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", TINY)
def test_mixed_batch_of_prefills_and_decodes_matches_transformers(
    name: str, tiny_dirs: dict[str, Path]
) -> None:
    """Three sequences share the cache and one batch: a decode, a first chunk, a
    middle chunk that does not sample, and a last chunk."""
    model = ours(tiny_dirs[name])
    block_tokens = 4
    cache_ = new_cache(model, 32, block_tokens)
    seqs = [prompt(21, seed=1), prompt(9, seed=2), prompt(30, seed=3)]
    tables = [[5, 0, 9, 12, 3, 30], [7, 31, 1], [2, 4, 6, 8, 10, 11, 13, 14]]
    # Step 1: sequence 0 prefills 20 tokens, sequence 2 prefills 10 (no sample).
    step1 = [
        SequenceChunk(seqs[0][:20], 0, tables[0], samples=True),
        SequenceChunk(seqs[2][:10], 0, tables[2], samples=False),
    ]
    # Step 2: sequence 0 decodes its 21st token, 1 prefills, 2 finishes its prompt.
    step2 = [
        SequenceChunk(seqs[0][20:], 20, tables[0], samples=True),
        SequenceChunk(seqs[1], 0, tables[1], samples=True),
        SequenceChunk(seqs[2][10:], 10, tables[2], samples=True),
    ]
    logits = []
    for step in (step1, step2):
        batch = ForwardBatch.build(
            step,
            block_tokens=block_tokens,
            device=model.device,
            sliding_window=model.arch.sliding_window,
        )
        logits.append(model.forward(batch, cache_))
    assert logits[0].shape[0] == 1
    expected = [hf_logits(tiny_dirs[name], ids)[-1] for ids in seqs]
    torch.testing.assert_close(
        logits[0][0], hf_logits(tiny_dirs[name], seqs[0][:20])[-1], atol=ATOL, rtol=0
    )
    torch.testing.assert_close(logits[1], torch.stack(expected), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", TINY)
def test_greedy_64_tokens_equal_transformers_generate(
    name: str, tiny_dirs: dict[str, Path]
) -> None:
    ids = prompt(11, seed=4)
    hf = hf_model(tiny_dirs[name])
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            max_new_tokens=64,
            min_new_tokens=64,
            do_sample=False,
            pad_token_id=0,
        )
    expected = out[0, len(ids) :].tolist()
    # min_new_tokens keeps transformers from ending on EOS; ban the same tokens here.
    eos = hf.generation_config.eos_token_id
    ours_ = greedy_generate(ours(tiny_dirs[name]), ids, 64, prefill_chunk=5, banned=eos)
    assert ours_ == expected


def test_forward_rejects_a_cache_of_another_shape(tiny_dirs: dict[str, Path]) -> None:
    model = ours(tiny_dirs["tiny-llama"])
    batch = ForwardBatch.build(
        [SequenceChunk([1, 2], 0, [0], samples=True)], block_tokens=4, device=model.device
    )
    with pytest.raises(ValueError, match="does not fit"):
        model.forward(batch, torch.zeros(2, 3, 2, 4, 2, 16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", TINY)
def test_bf16_logits_on_cuda_match_transformers(name: str, tiny_dirs: dict[str, Path]) -> None:
    loaded = load_model(tiny_dirs[name], device=torch.device("cuda"), dtype=torch.bfloat16)
    model = Transformer(loaded.arch, loaded.weights)
    ids = prompt(40)
    expected = hf_logits(tiny_dirs[name], ids)
    cache_ = new_cache(model, 12, 4)
    table = list(range(12))[::-1]
    for start, end in ((0, 25), (25, 40)):
        batch = ForwardBatch.build(
            [SequenceChunk(ids[start:end], start, table, samples=True)],
            block_tokens=4,
            device=model.device,
            sliding_window=model.arch.sliding_window,
        )
        logits = model.forward(batch, cache_)[0].cpu()
        # bf16 keeps 8 bits of mantissa: compare at about its resolution.
        torch.testing.assert_close(logits, expected[end - 1], atol=0.1, rtol=0.05)
