"""Where a forward pass reads each layer: frames, slots, and layers loaded back."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.engine.exec.arena import DeviceArena
from shunter.engine.exec.batch import ForwardBatch, SequenceChunk
from shunter.engine.exec.hf_config import ArchConfig, read_config
from shunter.engine.exec.loader import LayerWeights, load_host_weights
from shunter.engine.exec.model import Transformer, kv_block_shape
from shunter.engine.exec.packing import LayerPacking, PackedLayers, pack_layers
from shunter.engine.exec.slots import CopyStream, WeightFrames, measure_timing
from shunter.engine.memory.weights import WeightLayout, pages_for
from shunter.engine.plan import LayerLoad, SlotStream
from tests.engine.exec.conftest import CPU

NUM_LAYERS = 6
BLOCK_TOKENS = 4
PAGE = 16 * 1024


class Placed:
    """A model's weights in an arena, laid out as KVMemory would (a frame per layer,
    then the rest), with its KV cache in pages below them."""

    def __init__(self, model_dir: Path, device: torch.device) -> None:
        arch = ArchConfig.from_hf(read_config(model_dir))
        host = load_host_weights(model_dir, arch, dtype=torch.float32, pin=False)
        self.packed = pack_layers(host, pin=device.type == "cuda")
        frame = pages_for(self.packed.packing.nbytes, PAGE)
        other = pages_for(sum(t.nbytes for t in (host.embed, host.final_norm, host.lm_head)), PAGE)
        kv_pages = 8
        self.layout = WeightLayout(
            "m",
            layers=tuple(
                range(kv_pages + i * frame, kv_pages + (i + 1) * frame)
                for i in range(arch.num_layers)
            ),
            other=range(
                kv_pages + arch.num_layers * frame, kv_pages + arch.num_layers * frame + other + 1
            ),
        )
        self.arena = DeviceArena(self.layout.other.stop, PAGE, device)
        weights = self.arena.place_weights(host, self.packed, self.layout)
        self.model = Transformer(arch, weights)
        self.kv = self.arena.kv_cache(kv_block_shape(arch, BLOCK_TOKENS), torch.float32)
        self.frames = WeightFrames(self.packed, self.arena.frames(self.layout, self.packed))
        self.copies = CopyStream(device)

    def logits(self, stream: SlotStream | None, frames: bool = True) -> torch.Tensor:
        """One prefill of 9 tokens over blocks 0..2 (in KV pages), then its logits."""
        batch = ForwardBatch.build(
            [SequenceChunk(list(range(3, 12)), 0, [2, 0, 1], True)],
            block_tokens=BLOCK_TOKENS,
            device=self.arena.device,
        )
        if not frames:
            return self.model.forward(batch, self.kv)
        source = self.frames.begin(self.frames.schedule(stream), self.copies)
        return self.model.forward(batch, self.kv, source)


@pytest.fixture(scope="module")
def deep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = preset_config("tiny-qwen2") | {"num_hidden_layers": NUM_LAYERS}
    return init_model_dir(tmp_path_factory.mktemp("deep") / "m", config=config, seed=5)


def test_a_packed_layer_is_one_region_that_gives_back_every_tensor(deep_dir: Path) -> None:
    arch = ArchConfig.from_hf(read_config(deep_dir))
    host = load_host_weights(deep_dir, arch, dtype=torch.float32, pin=False)
    before = [layer.map(torch.clone) for layer in host.layers]
    packed = pack_layers(host, pin=False)
    assert packed.data.shape == (NUM_LAYERS, packed.packing.nbytes)
    for i, layer in enumerate(host.layers):
        for name in ("input_norm", "qkv", "qkv_bias", "o_proj", "post_norm", "gate_up", "down"):
            t = getattr(layer, name)
            assert torch.equal(t, getattr(before[i], name))
            # A view into row i of the one buffer.
            offset = t.data_ptr() - packed.data[i].data_ptr()
            assert offset >= 0 and offset + t.nbytes <= packed.packing.nbytes
    assert host.layers[0].o_bias is None  # absent tensors take no room
    assert LayerPacking.of(host.layers[0]) == packed.packing
    with pytest.raises(ValueError, match="flat uint8 region"):
        packed.packing.views(packed.data[0][:-1])


def test_streamed_layers_give_the_logits_of_resident_ones_while_lent_frames_hold_junk(
    deep_dir: Path,
) -> None:
    placed = Placed(deep_dir, CPU)
    expected = placed.logits(None, frames=False).clone()
    # Layers 1, 3 and 5 stream through frames 1 and 3 (two slots); frame 5 is lent.
    placed.frames.lend([5])
    placed.frames.frames[5].fill_(0x7F)  # KV writes over the old weights
    stream = SlotStream(layers=(1, 3, 5), slots=(1, 3))
    logits = placed.logits(stream)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    # Slot 1 last held layer 5 (the third streamed layer), slot 3 layer 3.
    assert torch.equal(placed.frames.frames[1], placed.packed.data[5])
    assert torch.equal(placed.frames.frames[3], placed.packed.data[3])
    assert placed.frames.frame_of == {0: 0, 2: 2, 4: 4}


def test_a_layer_neither_resident_nor_streamed_is_an_error(deep_dir: Path) -> None:
    placed = Placed(deep_dir, CPU)
    placed.frames.lend([2])
    with pytest.raises(RuntimeError, match=r"layers \[2\] are neither resident nor streamed"):
        placed.frames.schedule(None)
    with pytest.raises(RuntimeError, match="overlap lent frames"):
        placed.frames.schedule(SlotStream(layers=(2, 4), slots=(2,)))


def test_restored_layers_load_bit_exact_into_their_frames(deep_dir: Path) -> None:
    placed = Placed(deep_dir, CPU)
    expected = placed.logits(None, frames=False).clone()
    placed.frames.lend([2, 4])
    for f in (2, 4):
        placed.frames.frames[f].fill_(0x41)
    # Layers 0, 2 and 4 stream through frame 0 (one slot).
    placed.logits(SlotStream(layers=(0, 2, 4), slots=(0,)))
    # Back: layer 2 into frame 4, layer 4 into frame 2 (any frame takes any layer),
    # layer 0 into frame 0 (its old frame, a slot until now).
    loads = [LayerLoad(2, 4), LayerLoad(4, 2), LayerLoad(0, 0)]
    assert placed.frames.restore(loads, placed.copies) == 3
    assert placed.frames.lent == set()
    assert torch.equal(placed.frames.frames[4], placed.packed.data[2])
    assert torch.equal(placed.frames.frames[2], placed.packed.data[4])
    torch.testing.assert_close(placed.logits(None), expected, rtol=1e-5, atol=1e-5)
    # A load into a resident layer's frame: that layer must stream from now on.
    placed.frames.restore([LayerLoad(1, 3)], placed.copies)
    assert placed.frames.frame_of[1] == 3 and 3 not in placed.frames.frame_of
    with pytest.raises(RuntimeError, match=r"layers \[3\] are neither resident"):
        placed.frames.schedule(None)
    # Layer 3 streams through frame 1, free since layer 1 moved.
    torch.testing.assert_close(
        placed.logits(SlotStream((3,), (1,))), expected, rtol=1e-5, atol=1e-5
    )


def test_measured_timings_are_positive(deep_dir: Path) -> None:
    placed = Placed(deep_dir, CPU)
    t = measure_timing(placed.packed, CPU)
    assert t.t_transfer > 0 and t.t_decode == t.t_prefill > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_streamed_copies_overlap_compute_on_cuda() -> None:
    """Layers whose compute takes about as long as a layer's copy: a pass streaming a
    third of them takes much less than computing them all and copying the streamed
    ones back to back, and the pass reads exactly the host's weights."""
    device = torch.device("cuda")
    n, size = 9, 4096

    def matrix() -> torch.Tensor:
        return torch.randn(size, size, device=device) / size**0.5

    host = [
        LayerWeights(
            input_norm=torch.ones(size, device=device),
            qkv=matrix(),
            qkv_bias=None,
            o_proj=matrix(),
            o_bias=None,
            post_norm=torch.ones(size, device=device),
            gate_up=matrix(),
            down=matrix(),
        )
        for _ in range(n)
    ]
    packing = LayerPacking.of(host[0])
    from shunter.engine.exec.cuda_transfers import pinned_empty

    data = pinned_empty((n, packing.nbytes), torch.uint8)
    for i, layer in enumerate(host):
        packing.pack(layer, data[i])
    packed = PackedLayers(packing, data)
    arena = torch.empty(n * packing.nbytes, dtype=torch.uint8, device=device)
    regions = [arena[i * packing.nbytes : (i + 1) * packing.nbytes] for i in range(n)]
    for region, row in zip(regions, data, strict=True):
        region.copy_(row)
    frames = WeightFrames(packed, regions)
    copies = CopyStream(device)
    x = torch.randn(4096, size, device=device)

    def layer_compute(w: LayerWeights, reps: int) -> torch.Tensor:
        y = x
        for _ in range(reps):
            y = torch.tanh(y @ w.qkv.T) @ w.o_proj.T
        return y

    # Calibrate: enough matmuls a layer to take about as long as a layer's copy.
    t_copy = measure_timing(packed, device).t_transfer
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    layer_compute(frames.views[0], 4)
    torch.cuda.synchronize()
    reps = max(1, round(4 * t_copy / (time.perf_counter() - t0)))

    def run(stream: SlotStream | None) -> tuple[float, list[torch.Tensor]]:
        source = frames.begin(frames.schedule(stream), copies)
        outs = []
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(n):
            w = source.acquire(i)
            outs.append(layer_compute(w, reps)[:1, :8].clone())
            source.release(i)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, outs

    t_resident, expected = run(None)
    # Layers 0, 3 and 6 stream through frame 0; frames 3 and 6 hold KV now.
    frames.lend([3, 6])
    for f in (3, 6):
        regions[f].zero_()
    streamed = SlotStream(layers=(0, 3, 6), slots=(0,))
    run(streamed)  # warm up
    t_streamed, outs = run(streamed)
    for a, b in zip(outs, expected, strict=True):
        torch.testing.assert_close(a, b)
    # Only the first copy has nothing to hide behind: serially the pass would take
    # three copies more than the resident one.
    assert t_streamed < t_resident + 1.5 * t_copy, (t_streamed, t_resident, t_copy)
    # Each copy's time on the link, read from its events: about one copy alone.
    source = frames.begin(frames.schedule(streamed), copies)
    for i in range(n):
        source.acquire(i)
        source.release(i)
    torch.cuda.synchronize()
    copy_s = source.times.copy_s()
    assert copy_s is not None and 0.5 * t_copy < copy_s < 3 * t_copy, (copy_s, t_copy)
