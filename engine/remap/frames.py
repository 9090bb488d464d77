"""Which frame holds which layer of a model, and what changing its layout costs.

A model's decoder layers own ``n`` frames: frame ``i`` is the run of pages
``place_weights`` gave layer ``i``, all of one size. Under a Layout, each resident layer
holds a frame, the slots hold ``num_slots`` frames and the other ``alpha`` frames are KV
memory. A resident layer need not sit in its own frame: when the layout changes, a layer
that stops streaming moves into a frame freed by a layer that starts streaming (one
host-to-device load), so growing ``alpha`` never needs KV memory back. Shrinking it
does: frames come back from the KV cache once their live blocks have moved out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shunter.engine.plan import LayerLoad
from shunter.engine.remap.layers import Layout, resident_layout


@dataclass(frozen=True)
class WeightMap:
    """A layout and its frames: ``frame_of`` maps each resident layer to its frame,
    ``slots`` are the frames the streamed layers take turns in, ``reclaimed`` the
    frames given to the KV cache. Together they are every frame exactly once."""

    layout: Layout
    frame_of: Mapping[int, int]
    slots: tuple[int, ...]
    reclaimed: frozenset[int]

    @staticmethod
    def initial(num_layers: int) -> WeightMap:
        """Every layer resident in its own frame."""
        return WeightMap(
            resident_layout(num_layers), {i: i for i in range(num_layers)}, (), frozenset()
        )

    @property
    def alpha(self) -> int:
        return self.layout.alpha

    def slot_of(self, position: int) -> int:
        """The slot frame the ``position``-th streamed layer of a pass is copied into."""
        return self.slots[position % len(self.slots)]

    def check(self) -> None:
        """Raise AssertionError unless the frames partition ``range(num_layers)`` and the
        layout's counts hold."""
        n, layout = self.layout.num_layers, self.layout
        if sorted(self.frame_of) != list(layout.resident):
            raise AssertionError(f"resident layers {sorted(self.frame_of)} != {layout.resident}")
        frames = [*self.frame_of.values(), *self.slots, *self.reclaimed]
        if sorted(frames) != list(range(n)):
            raise AssertionError(f"frames are not a partition of {n}: {sorted(frames)}")
        if len(self.slots) != layout.num_slots or len(self.reclaimed) != layout.alpha:
            raise AssertionError("slot or reclaimed frame count disagrees with the layout")


@dataclass(frozen=True)
class Transition:
    """From one WeightMap to the next: first ``take_back`` comes back from the KV cache
    (its live blocks moved out), then ``loads`` fill frames with layers that become
    resident, and ``reclaim`` goes to the KV cache."""

    after: WeightMap
    take_back: tuple[int, ...]
    loads: tuple[LayerLoad, ...]
    reclaim: tuple[int, ...]


def transition(before: WeightMap, layout: Layout, take_back_order: Sequence[int]) -> Transition:
    """What it takes to run ``layout`` instead of ``before.layout``.

    Resident layers that stay resident keep their frames. Frames freed (old slots and
    the frames of layers that start streaming) go first to layers that stop streaming,
    then to the new slots; the highest-numbered ones left over are reclaimed. When too
    few are freed, reclaimed frames come back in ``take_back_order`` (cheapest first).
    """
    old = set(before.layout.streamed)
    new = set(layout.streamed)
    starting = sorted(new - old)
    stopping = sorted(old - new)
    freed = sorted([*before.slots, *(before.frame_of[layer] for layer in starting)])
    need = layout.num_slots + len(stopping)
    take_back: list[int] = []
    if need > len(freed):
        take_back = [f for f in take_back_order if f in before.reclaimed][: need - len(freed)]
        if len(take_back) < need - len(freed):
            raise ValueError("take_back_order lacks reclaimed frames to take back")
    # Taken-back frames are used first: they exist only to be used.
    usable = take_back + freed
    loads = tuple(LayerLoad(layer, frame) for layer, frame in zip(stopping, usable, strict=False))
    slots = tuple(usable[len(stopping) : need])
    reclaim = tuple(usable[need:])
    frame_of = {layer: f for layer, f in before.frame_of.items() if layer not in new}
    frame_of.update(loads)
    reclaimed = (before.reclaimed - set(take_back)) | set(reclaim)
    after = WeightMap(layout, dict(sorted(frame_of.items())), slots, frozenset(reclaimed))
    return Transition(after, tuple(take_back), loads, reclaim)
