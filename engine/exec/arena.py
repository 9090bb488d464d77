"""The device arena's bytes: one allocation that holds every model's weights and KV.

KVMemory (pure logic) decides which pages hold what; this module gives those pages
tensor views. A model's KV cache is the whole arena seen as an array of that model's
block-first blocks, block ``b`` at bytes ``[b * block_bytes, (b + 1) * block_bytes)``,
exactly as ``BlockPool`` numbers them; only blocks in its KV pages are ever indexed.
Decoder layer i's weights are one packed region (``packing``) at the start of its
*frame*, the run of pages ``place_weights`` gave it, so handing those pages to the KV
cache later frees exactly that layer, and any layer loads into any frame of its model
with one copy.
"""

from __future__ import annotations

import math

import torch

from shunter.engine.exec.loader import ModelWeights, copy_weights
from shunter.engine.exec.packing import PackedLayers, align
from shunter.engine.memory.weights import WeightLayout


class DeviceArena:
    """``num_pages * page_bytes`` zeroed bytes on ``device``.

    Zeroed because attention multiplies the unused slots of a sequence's last block by
    zero weights: they must hold finite values, and stale KV or weights always are.
    """

    def __init__(self, num_pages: int, page_bytes: int, device: torch.device) -> None:
        self.page_bytes = page_bytes
        self.data = torch.zeros(num_pages * page_bytes, dtype=torch.uint8, device=device)

    @property
    def device(self) -> torch.device:
        return self.data.device

    def kv_cache(self, block_shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The arena as ``[num_blocks, *block_shape]`` blocks of ``dtype`` (a view)."""
        block_bytes = math.prod(block_shape) * dtype.itemsize
        num_blocks = self.data.numel() // block_bytes
        view = self.data[: num_blocks * block_bytes].view(dtype)
        return view.view(num_blocks, *block_shape)

    def pages(self, run: range) -> torch.Tensor:
        """The bytes of the pages ``run`` (a uint8 view)."""
        return self.data[run.start * self.page_bytes : run.stop * self.page_bytes]

    def frames(self, layout: WeightLayout, packed: PackedLayers) -> list[torch.Tensor]:
        """Each weight frame's packed region (``packed.packing.nbytes`` bytes at the start
        of its pages), frame i first. Raises ValueError when a layer overruns its pages
        (the layout is sized from ModelSpec, which does not count biases)."""
        regions = []
        for i, run in enumerate(layout.layers):
            pages = self.pages(run)
            if packed.packing.nbytes > pages.numel():
                raise ValueError(
                    f"model {layout.model!r}: layer {i} overruns pages "
                    f"{run.start}..{run.stop - 1} of {self.page_bytes} bytes"
                )
            regions.append(pages[: packed.packing.nbytes])
        return regions

    def place_weights(
        self, host: ModelWeights, packed: PackedLayers, layout: WeightLayout
    ) -> ModelWeights:
        """Copy the model into the pages of ``layout``: layer i (``packed.data[i]``, one
        copy) into frame i, embeddings, final norm and head (from ``host``) into
        ``layout.other``. Raises ValueError when anything overruns its pages."""
        frames = self.frames(layout, packed)
        if len(packed) != len(frames):
            raise ValueError(f"{len(packed)} layers for {len(frames)} frames")
        for frame, data in zip(frames, packed.data, strict=True):
            frame.copy_(data, non_blocking=True)
        cursor = layout.other.start * self.page_bytes

        def allocate(layer: int | None, like: torch.Tensor) -> torch.Tensor:
            nonlocal cursor
            assert layer is None  # decoder layers are placed whole, above
            start, nbytes = cursor, like.numel() * like.element_size()
            if start + nbytes > layout.other.stop * self.page_bytes:
                raise ValueError(
                    f"model {layout.model!r}: the embeddings and head overrun pages "
                    f"{layout.other.start}..{layout.other.stop - 1} of {self.page_bytes} bytes"
                )
            cursor = align(start + nbytes)
            return self.data[start : start + nbytes].view(like.dtype).view(like.shape)

        outer = copy_weights(host, allocate, layers=False)
        outer.layers = [packed.packing.views(frame) for frame in frames]
        return outer
