"""The device arena's views: weights in their pages, KV blocks where the pools number them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from shunter.engine.exec.arena import DeviceArena
from shunter.engine.exec.hf_config import ArchConfig, read_config
from shunter.engine.exec.loader import load_host_weights
from shunter.engine.exec.model import kv_block_shape
from shunter.engine.exec.packing import ALIGN_BYTES, pack_layers
from shunter.engine.memory.weights import WeightLayout
from tests.engine.exec.conftest import CPU

PAGE = 16 * 1024


def test_weights_live_in_their_pages_and_equal_the_host_copy(tiny_dirs: dict[str, Path]) -> None:
    arch = ArchConfig.from_hf(read_config(tiny_dirs["tiny-qwen2"]))
    weights = load_host_weights(tiny_dirs["tiny-qwen2"], arch, dtype=torch.float32, pin=False)
    packed = pack_layers(weights, pin=False)
    arena = DeviceArena(40, PAGE, CPU)
    layout = WeightLayout("q", layers=(range(28, 40), range(16, 28)), other=range(4, 16))
    placed = arena.place_weights(weights, packed, layout)
    base = arena.data.data_ptr()

    def pages(t: torch.Tensor) -> range:
        start = t.data_ptr() - base
        return range(start // PAGE, (start + t.numel() * t.element_size() - 1) // PAGE + 1)

    for i, layer in enumerate(placed.layers):
        for field in ("input_norm", "qkv", "qkv_bias", "o_proj", "post_norm", "gate_up", "down"):
            t = getattr(layer, field)
            assert set(pages(t)) <= set(layout.layers[i]), (i, field)
            assert (t.data_ptr() - base) % ALIGN_BYTES == 0
            assert torch.equal(t, getattr(weights.layers[i], field))
        # A layer is one region at the start of its frame, byte for byte the host's.
        frame = arena.frames(layout, packed)[i]
        assert frame.data_ptr() - base == layout.layers[i].start * PAGE
        assert torch.equal(frame, packed.data[i])
    assert set(pages(placed.embed)) <= set(layout.other)
    assert placed.lm_head is placed.embed  # tied: one copy
    assert torch.equal(placed.final_norm, weights.final_norm)
    # The host copy stays separate storage.
    placed.layers[0].qkv.zero_()
    assert weights.layers[0].qkv.abs().sum() > 0


def test_weights_that_overrun_their_pages_are_refused(tiny_dirs: dict[str, Path]) -> None:
    arch = ArchConfig.from_hf(read_config(tiny_dirs["tiny-llama"]))
    weights = load_host_weights(tiny_dirs["tiny-llama"], arch, dtype=torch.float32, pin=False)
    packed = pack_layers(weights, pin=False)
    layout = WeightLayout("l", layers=(range(20, 32), range(32, 40)), other=range(0, 20))
    with pytest.raises(ValueError, match="layer 1 overruns"):
        DeviceArena(40, PAGE, CPU).place_weights(weights, packed, layout)
    layout = WeightLayout("l", layers=(range(28, 40), range(16, 28)), other=range(15, 16))
    with pytest.raises(ValueError, match="embeddings and head overrun"):
        DeviceArena(40, PAGE, CPU).place_weights(weights, packed, layout)


def test_kv_block_b_sits_at_b_times_block_bytes(tiny_dirs: dict[str, Path]) -> None:
    arch = ArchConfig.from_hf(read_config(tiny_dirs["tiny-llama"]))
    arena = DeviceArena(4, PAGE, CPU)
    shape = kv_block_shape(arch, 4)
    kv = arena.kv_cache(shape, torch.float32)
    block_bytes = math.prod(shape) * 4
    assert kv.shape == (4 * PAGE // block_bytes, *shape)
    kv[5].fill_(1.0)
    written = torch.nonzero(arena.data).flatten()
    assert int(written.min()) >= 5 * block_bytes and int(written.max()) < 6 * block_bytes
    assert arena.data.abs().sum() > 0
