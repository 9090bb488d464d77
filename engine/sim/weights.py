"""Per-layer weight residency on the virtual clock: when each layer of a forward pass can
run, given the layers streamed through slots and the one-time loads of restored layers.

A resident layer runs as soon as the layer before it is done, unless it is being loaded
back (restored after remapping): then it waits for that load. A streamed layer runs
once its host-to-device copy into its slot has landed; the copy starts when the copy
stream is free and the slot's previous occupant has run (one slot: the previous
streamed layer; two slots: the one before it). A layer that is neither resident nor
copied in time makes the pass wait: a *stall*, recorded with its length.

The pipeline is circular (Oneiros §5.4): right after a pass, the first streamed layers
of the next pass are copied into the slots as they free up, during whatever comes
between the two passes. A changed layout starts over with empty slots.

All models' weight copies go on one stream of the host-to-device link
(``transfers.HostToDeviceLink``), in issue order, and share the link with the KV
swap-ins' stream: while both have a copy under way each moves at half the link, so the
two never move more together than the link's one-direction bandwidth, and a layer's copy
is slowed by a swap-in batch but does not wait for the whole of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shunter.engine.sim.transfers import WEIGHT_STREAM, HostToDeviceLink, LinkCopy


@dataclass(frozen=True)
class PassTiming:
    """One forward pass: ``end`` time, ``stall_s`` spent waiting for weights,
    ``num_stalls`` layers that waited, ``copied_bytes`` of weights issued during it,
    ``copy_s`` the mean time its slot copies took on the link (None without any;
    ``HostToDeviceLink.took``), as the torch executor reports its own."""

    end: float
    stall_s: float
    num_stalls: int
    copied_bytes: int
    copy_s: float | None = None


@dataclass
class _Pipeline:
    layout: tuple[tuple[int, ...], int] = ((), 0)
    ahead: dict[int, LinkCopy] = field(default_factory=dict)  # position -> its copy
    slot_free: list[float] = field(default_factory=list)  # when each slot's occupant ran
    loads: dict[int, LinkCopy] = field(default_factory=dict)  # restored layer -> its load


class WeightStreams:
    """Weight copies of every model on one stream, and the layer waits they cause.

    ``t_transfer[m]`` is the time to copy one layer of model m host-to-device (the link
    alone) and ``layer_bytes[m]`` its size; ``link`` is the host-to-device link the
    copies share with KV swap-ins (a link of their own when not given).
    """

    def __init__(
        self,
        t_transfer: Mapping[str, float],
        layer_bytes: Mapping[str, int],
        link: HostToDeviceLink | None = None,
    ) -> None:
        self.t_transfer = dict(t_transfer)
        self.layer_bytes = dict(layer_bytes)
        self.link = HostToDeviceLink() if link is None else link
        self._pipelines: dict[str, _Pipeline] = {}

    def _copy(self, model: str, not_before: float) -> LinkCopy:
        return self.link.issue(WEIGHT_STREAM, not_before, self.t_transfer[model])

    def load(self, model: str, layers: Sequence[int], now: float) -> int:
        """Issue one-time loads of ``layers`` (restored to residency) at ``now``; the
        model's next pass waits for each before running it. Returns the bytes issued."""
        pipe = self._pipelines.setdefault(model, _Pipeline())
        for layer in sorted(layers):
            pipe.loads[layer] = self._copy(model, now)
        return len(layers) * self.layer_bytes[model]

    def run_pass(
        self,
        model: str,
        start: float,
        *,
        num_layers: int,
        t_layer: float,
        t_head: float,
        streamed: Sequence[int] = (),
        num_slots: int = 0,
    ) -> PassTiming:
        """Time one forward pass of ``model`` starting at ``start``: ``num_layers`` layers
        of ``t_layer`` seconds each, then the output head. ``streamed`` layers (in
        order) take turns in ``num_slots`` slots; layers loaded with ``load`` wait for
        their loads."""
        pipe = self._pipelines.setdefault(model, _Pipeline())
        if pipe.layout != (tuple(streamed), num_slots):
            pipe.layout = (tuple(streamed), num_slots)
            pipe.ahead = {}
            pipe.slot_free = [start] * num_slots
        layer_bytes = self.layer_bytes[model]
        copied = 0
        loads, pipe.loads = pipe.loads, {}
        position_of = {layer: i for i, layer in enumerate(streamed)}
        t, done, stall, num_stalls = start, 0, 0.0, 0
        took: list[float] = []
        for layer in sorted({*loads, *streamed}):
            t += (layer - done) * t_layer  # the layers before it, all resident
            position = position_of.get(layer)
            if position is not None:
                copy = pipe.ahead.pop(position, None)
                if copy is None:
                    # The copy stream is in position order, so issuing it now is issuing
                    # it when the slot freed (its previous occupant ran earlier).
                    copy = self._copy(model, pipe.slot_free[position % num_slots])
                    copied += layer_bytes
            else:
                copy = loads[layer]
            # Nothing issued from here on starts before this pass's layers, so what the
            # link projects for this copy now is when it lands.
            landed = self.link.landed(copy)
            if position is not None:
                took.append(self.link.took(copy))
            if landed > t:
                stall += landed - t
                num_stalls += 1
                t = landed
            t += t_layer
            done = layer + 1
            if position is not None:
                pipe.slot_free[position % num_slots] = t
        end = t + (num_layers - done) * t_layer + t_head
        for position in range(min(num_slots, len(streamed))):
            pipe.ahead[position] = self._copy(model, pipe.slot_free[position])
            copied += layer_bytes
        copy_s = sum(took) / len(took) if took else None
        return PassTiming(end, stall, num_stalls, copied, copy_s)
