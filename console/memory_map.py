"""A node's memory map, read from its engine's ``/admin/state`` snapshot.

Pure functions over the snapshot (``engine.api.state.EngineState``; no database): the
device arena's pages by owner (each model's resident weights, each model's KV slabs, free
pages), the weight pages that remapping lent to the KV cache, and host memory (each
model's full weight copy, the KV swap space in use and free).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shunter.engine.api.state import EngineState, ModelState

# Rows of the picture, top to bottom.
ROW_HBM = "HBM"
ROW_LENT = "lent to KV"
ROW_HOST = "host"


@dataclass(frozen=True)
class Segment:
    """A run of bytes in one row of the map: ``kind`` is ``weights``, ``kv``, ``free``,
    ``lent`` (weight pages of ``model`` now holding KV), ``host_weights``, ``swap`` or
    ``swap_free``; ``offset`` is where it starts in its row."""

    row: str
    kind: str
    model: str | None
    offset: int
    bytes: int

    @property
    def label(self) -> str:
        names = {
            "weights": "weights",
            "kv": "KV",
            "free": "free",
            "lent": "layers lent to KV",
            "host_weights": "weight copy",
            "swap": "KV swap in use",
            "swap_free": "KV swap free",
        }
        name = names[self.kind]
        return f"{self.model} {name}" if self.model else name


@dataclass(frozen=True)
class MemoryMap:
    """The segments of every row and each row's capacity in bytes."""

    segments: tuple[Segment, ...]
    hbm_bytes: int
    host_bytes: int

    def row(self, row: str) -> list[Segment]:
        return [s for s in self.segments if s.row == row]


def memory_map(
    state: EngineState | Mapping[str, Any], host_weight_bytes: Mapping[str, int]
) -> MemoryMap:
    """The map of one snapshot (an ``EngineState``, or a body it parses). ``host_weight_bytes``
    gives each model's full weight bytes (the host keeps a copy of every model's weights);
    a model missing from it counts its resident plus remapped weight bytes."""
    snapshot = state if isinstance(state, EngineState) else EngineState.parse(state)
    arena = snapshot.arena
    page_bytes = arena.page_bytes
    owners = arena.pages_by_owner
    models = snapshot.models
    names = list(models)
    # Owners the snapshot lists for models it does not describe still take their pages.
    for owner in owners:
        kind, _, model = owner.partition(":")
        if model and model not in names and kind in {"weights", "kv"}:
            names.append(model)

    segments: list[Segment] = []
    offset = 0
    for kind in ("weights", "kv"):
        for name in names:
            size = arena.owner_bytes(f"{kind}:{name}")
            if size:
                segments.append(Segment(ROW_HBM, kind, name, offset, size))
                offset += size
    kv_start = sum(s.bytes for s in segments if s.kind == "weights")
    free = arena.owner_bytes("free")
    if free:
        segments.append(Segment(ROW_HBM, "free", None, offset, free))
        offset += free
    hbm_total = max(arena.num_pages * page_bytes, offset)

    # Lent pages are KV pages: drawn under the KV region, they say how much of it sits on
    # weight pages that remapping took from each model.
    lent_offset = kv_start
    for name in names:
        lent = models[name].weight_bytes_remapped if name in models else 0
        if lent:
            segments.append(Segment(ROW_LENT, "lent", name, lent_offset, lent))
            lent_offset += lent

    host_offset = 0
    for name in names:
        info = models.get(name, ModelState())
        size = host_weight_bytes.get(name) or (
            info.weight_bytes_resident + info.weight_bytes_remapped
        )
        if size:
            segments.append(Segment(ROW_HOST, "host_weights", name, host_offset, size))
            host_offset += size
    swap_used, swap_total = snapshot.host_swap.bytes_used, snapshot.host_swap.bytes_total
    if swap_used:
        segments.append(Segment(ROW_HOST, "swap", None, host_offset, swap_used))
        host_offset += swap_used
    if swap_total > swap_used:
        segments.append(Segment(ROW_HOST, "swap_free", None, host_offset, swap_total - swap_used))
        host_offset += swap_total - swap_used
    return MemoryMap(segments=tuple(segments), hbm_bytes=hbm_total, host_bytes=host_offset)
