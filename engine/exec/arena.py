"""The device arena's bytes: one allocation that holds every model's weights and KV.

KVMemory (pure logic) decides which pages hold what; this module gives those pages
tensor views. A model's KV cache is the whole arena seen as an array of that model's
block-first blocks, block ``b`` at bytes ``[b * block_bytes, (b + 1) * block_bytes)``,
exactly as ``BlockPool`` numbers them; only blocks in its KV pages are ever indexed.
A weight layer's tensors are packed into the run of pages ``place_weights`` gave it,
so handing those pages to the KV cache later frees exactly that layer.
"""

from __future__ import annotations

import math

import torch

from shunter.engine.exec.loader import ModelWeights, copy_weights
from shunter.engine.memory.weights import WeightLayout

# Tensor starts inside a page run are aligned for vectorized loads of any dtype.
ALIGN_BYTES = 256


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

    def place_weights(self, host: ModelWeights, layout: WeightLayout) -> ModelWeights:
        """Copy ``host`` into the pages of ``layout``: layer i into ``layout.layers[i]``,
        embeddings, final norm and head into ``layout.other``.

        Raises ValueError when a layer's tensors overrun its pages (the layout is sized
        from ModelSpec, which does not count biases).
        """
        cursor: dict[int | None, int] = {}

        def allocate(layer: int | None, like: torch.Tensor) -> torch.Tensor:
            pages = layout.other if layer is None else layout.layers[layer]
            start = cursor.get(layer, pages.start * self.page_bytes)
            nbytes = like.numel() * like.element_size()
            if start + nbytes > pages.stop * self.page_bytes:
                where = "embeddings and head" if layer is None else f"layer {layer}"
                raise ValueError(
                    f"model {layout.model!r}: the {where} overrun pages "
                    f"{pages.start}..{pages.stop - 1} of {self.page_bytes} bytes"
                )
            cursor[layer] = -(-(start + nbytes) // ALIGN_BYTES) * ALIGN_BYTES
            return self.data[start : start + nbytes].view(like.dtype).view(like.shape)

        return copy_weights(host, allocate)
