"""A decoder layer as one contiguous region of bytes, on the host and in its frame.

Every decoder layer of a model has the same tensors with the same shapes, so one
``LayerPacking`` says where each of them sits inside a region: in ``LayerWeights``
field order, each start aligned to ``ALIGN_BYTES``. The host copy of a model's layers is
one buffer of such regions (``PackedLayers``), and each weight frame on the device holds
one region laid out the same way, so loading a layer into a frame or a slot is a single
copy of ``nbytes`` bytes, whichever layer it is.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from shunter.engine.exec.loader import LayerWeights, ModelWeights

# Tensor starts inside a region are aligned for vectorized loads of any dtype.
ALIGN_BYTES = 256
_FIELDS = tuple(f.name for f in dataclasses.fields(LayerWeights))


def align(num_bytes: int) -> int:
    return -(-num_bytes // ALIGN_BYTES) * ALIGN_BYTES


@dataclass(frozen=True)
class PackedTensor:
    name: str
    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class LayerPacking:
    """Where each present tensor of a layer sits in a region of ``nbytes`` bytes."""

    tensors: tuple[PackedTensor, ...]
    nbytes: int

    @classmethod
    def of(cls, layer: LayerWeights) -> LayerPacking:
        tensors, offset = [], 0
        for name in _FIELDS:
            t: torch.Tensor | None = getattr(layer, name)
            if t is None:
                continue
            tensors.append(PackedTensor(name, offset, tuple(t.shape), t.dtype))
            offset = align(offset + t.numel() * t.element_size())
        return cls(tuple(tensors), offset)

    def views(self, region: torch.Tensor) -> LayerWeights:
        """The layer's tensors as views into ``region`` (uint8, at least ``nbytes``)."""
        if region.dtype != torch.uint8 or region.dim() != 1 or region.numel() < self.nbytes:
            raise ValueError(f"a layer needs a flat uint8 region of {self.nbytes} bytes")
        fields: dict[str, torch.Tensor | None] = dict.fromkeys(_FIELDS)
        for t in self.tensors:
            fields[t.name] = region[t.offset : t.offset + t.nbytes].view(t.dtype).view(t.shape)
        return LayerWeights(**fields)  # type: ignore[arg-type]

    def pack(self, layer: LayerWeights, region: torch.Tensor) -> None:
        """Copy ``layer``'s tensors into ``region`` at their offsets."""
        for t in self.tensors:
            src = getattr(layer, t.name)
            if tuple(src.shape) != t.shape or src.dtype != t.dtype:
                raise ValueError(f"{t.name}: {tuple(src.shape)} {src.dtype} does not fit {t}")
        views = self.views(region)
        for t in self.tensors:
            getattr(views, t.name).copy_(getattr(layer, t.name))


@dataclass(frozen=True)
class PackedLayers:
    """A model's decoder layers on the host, ``data[i]`` the packed region of layer i."""

    packing: LayerPacking
    data: torch.Tensor  # uint8 [num_layers, packing.nbytes]

    def __len__(self) -> int:
        return self.data.shape[0]


def pack_layers(host: ModelWeights, *, pin: bool) -> PackedLayers:
    """Move ``host``'s decoder layers into one host buffer (page-locked with ``pin``,
    which needs CUDA) and return it.

    ``host.layers`` is replaced in place, layer by layer, by views into the buffer, so
    each original layer is freed as soon as it is packed (when nothing else holds it).
    Raises ValueError when the layers differ in shapes or dtypes.
    """
    if not host.layers:
        raise ValueError("a model needs at least one decoder layer")
    packing = LayerPacking.of(host.layers[0])
    shape = (len(host.layers), packing.nbytes)
    if pin:
        from shunter.engine.exec.cuda_transfers import pinned_empty

        data = pinned_empty(shape, torch.uint8)
    else:
        data = torch.empty(shape, dtype=torch.uint8)
    # Alignment gaps are copied with each region: keep them deterministic.
    data.zero_()
    for i, layer in enumerate(host.layers):
        packing.pack(layer, data[i])
        host.layers[i] = packing.views(data[i])
    return PackedLayers(packing, data)
