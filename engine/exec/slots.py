"""Where each decoder layer of a model is read from, and the slot streaming of remapped
layers through a forward pass: the executor's side of Oneiros' async transfer engine.

A model's layers start resident, layer i in frame i (``DeviceArena.frames``). The plan
changes that (``StepPlan``): frames in ``remapped`` become KV memory, so no layer may
be read from them again; ``restored`` loads a layer from the host copy into a frame,
where it is read from then on; ``streams`` names the layers a forward pass copies into
slot frames, each just before it runs. Every copy moves one packed layer region.

Planning and execution are split as in FlashInfer's ``plan()`` / ``run()``:
``WeightFrames.schedule`` turns a ``SlotStream`` into a ``SlotSchedule`` (positions,
slot regions and views; built once per layout and kept), and a ``SlotPass`` runs it
layer by layer. On a CUDA device the copies run on a copy stream: at the start of a
pass the first streamed layers are copied into the free slots, each later one as soon
as the slot's previous layer has been queued on the compute stream (its copy waits on
an event recorded then), and a streamed layer's kernels wait on its copy's event. So a
copy overlaps the layers computed between two streamed layers. On the CPU each copy is
a plain copy right before its layer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from shunter.engine.exec.host_copy import copy_on_this_thread
from shunter.engine.exec.loader import LayerWeights
from shunter.engine.exec.packing import PackedLayers
from shunter.engine.plan import LayerLoad, SlotStream
from shunter.engine.remap.timing import LayerTiming


@dataclass(frozen=True)
class SlotSchedule:
    """One layout's streaming: ``position[layer]`` is its turn in a pass, the ``p``-th
    streamed layer is copied into ``regions[p % len(regions)]`` and read through
    ``views`` of the same slot."""

    layers: tuple[int, ...]
    position: dict[int, int]
    regions: tuple[torch.Tensor, ...]
    views: tuple[LayerWeights, ...]


@dataclass(frozen=True)
class QueuedCopy:
    """A layer copy queued on a CUDA copy stream: ``begun`` is recorded on the stream
    just before it, ``done`` once it has landed (what a reader waits on)."""

    begun: torch.cuda.Event
    done: torch.cuda.Event

    def seconds(self) -> float:
        """How long it took on the link (read once it has landed)."""
        return float(self.begun.elapsed_time(self.done)) / 1e3


class CopyStream:
    """Host-to-device copies of layers: on a CUDA copy stream, or on the calling thread
    alone on CPU (``copy_on_this_thread``).

    ``copy(dst, src)`` queues one copy after the work already queued on the compute
    stream and returns it (None on CPU, where it has completed).
    ``synchronize()`` waits for every queued copy.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream: torch.cuda.Stream | None = None
        if device.type == "cuda":
            self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> QueuedCopy | None:
        if self.stream is None:
            copy_on_this_thread(dst, src)
            return None
        # The destination's previous readers are on the compute stream.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            begun = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            begun.record(self.stream)
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            done.record(self.stream)
        return QueuedCopy(begun, done)

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()


class WeightFrames:
    """Where one model's decoder layers are read from.

    ``frames[f]`` is frame f's packed region in the arena, ``host`` the model's packed
    host layers. ``frame_of`` maps each layer read from a frame to that frame; ``lent``
    holds the frames handed to the KV cache. A layer that starts streaming while its
    model does not run stays in ``frame_of`` until its model's next pass: its frame,
    if it became a slot, is only overwritten by that pass.
    """

    def __init__(self, host: PackedLayers, frames: list[torch.Tensor]) -> None:
        if len(host) != len(frames):
            raise ValueError(f"{len(host)} layers for {len(frames)} frames")
        self.host = host
        self.frames = frames
        self.views = [host.packing.views(f) for f in frames]
        self.frame_of: dict[int, int] = {i: i for i in range(len(frames))}
        self.lent: set[int] = set()
        self._schedules: dict[SlotStream, SlotSchedule] = {}
        self._restoring: torch.cuda.Event | None = None

    @property
    def num_layers(self) -> int:
        return len(self.frames)

    def lend(self, frames: Iterable[int]) -> None:
        """Frames become KV memory: the layers resident in them stop being resident."""
        lent = set(frames)
        self.lent |= lent
        self.frame_of = {layer: f for layer, f in self.frame_of.items() if f not in lent}

    def restore(self, loads: Iterable[LayerLoad], copies: CopyStream) -> int:
        """Load each layer from the host copy into its frame, where it is read from
        next; returns the layers loaded. The next pass waits for the copies."""
        n = 0
        for load in loads:
            # A frame is freed for a load by the layer in it starting to stream this
            # step (it is read from a slot from now on), or comes back from the KV cache.
            self.frame_of = {layer: f for layer, f in self.frame_of.items() if f != load.frame}
            self.lent.discard(load.frame)
            queued = copies.copy(self.frames[load.frame], self.host.data[load.layer])
            self._restoring = None if queued is None else queued.done
            self.frame_of[load.layer] = load.frame
            n += 1
        return n

    def schedule(self, stream: SlotStream | None) -> SlotSchedule:
        """The streaming of ``stream`` (none: every layer resident)."""
        stream = stream or SlotStream((), ())
        schedule = self._schedules.get(stream)
        if schedule is None:
            if self.lent.intersection(stream.slots):
                raise RuntimeError(f"slots {stream.slots} overlap lent frames {self.lent}")
            schedule = SlotSchedule(
                layers=stream.layers,
                position={layer: p for p, layer in enumerate(stream.layers)},
                regions=tuple(self.frames[f] for f in stream.slots),
                views=tuple(self.views[f] for f in stream.slots),
            )
            self._schedules = {stream: schedule}  # the layout in use; older ones are done
        # Streamed layers are read from slots from now on; their old frames may be slots.
        for layer in schedule.layers:
            self.frame_of.pop(layer, None)
        missing = set(range(self.num_layers)) - set(self.frame_of) - set(schedule.position)
        if missing:
            raise RuntimeError(f"layers {sorted(missing)} are neither resident nor streamed")
        return schedule

    def begin(self, schedule: SlotSchedule, copies: CopyStream) -> SlotPass:
        """Start a forward pass (queue its first slot copies)."""
        if self._restoring is not None:
            torch.cuda.current_stream(copies.device).wait_event(self._restoring)
            self._restoring = None
        return SlotPass(self, schedule, copies)


@dataclass
class PassTimes:
    """What a pass spent: its waits for weight copies (on CPU seconds already; on CUDA,
    events read once the pass has run), and on CUDA its slot copies."""

    t_wait_s: float = 0.0
    waits: list[tuple[torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list)
    copies: list[QueuedCopy] = field(default_factory=list)

    def wait_s(self) -> float:
        waited_ms = sum(float(a.elapsed_time(b)) for a, b in self.waits)
        return self.t_wait_s + waited_ms / 1e3

    def copy_s(self) -> float | None:
        """The mean time one slot copy took on the link; None without any, and on CPU,
        where each copy runs alone on the engine's thread and shares nothing: its time
        there is the profiled T_T plus whatever preempted the thread."""
        took = [c.seconds() for c in self.copies]
        return sum(took) / len(took) if took else None


class SlotPass:
    """A ``LayerSource`` for one forward pass over a ``WeightFrames`` and a schedule."""

    def __init__(self, frames: WeightFrames, schedule: SlotSchedule, copies: CopyStream) -> None:
        self.frames = frames
        self.schedule = schedule
        self.copies = copies
        self.times = PassTimes()
        self.num_copies = 0
        self._landed: dict[int, QueuedCopy] = {}
        if copies.stream is not None:
            for p in range(min(len(schedule.regions), len(schedule.layers))):
                self._issue(p)

    @property
    def streams(self) -> bool:
        """Whether the pass streams any layer into a slot."""
        return bool(self.schedule.layers)

    def _issue(self, p: int) -> None:
        s = self.schedule
        slot = p % len(s.regions)
        queued = self.copies.copy(s.regions[slot], self.frames.host.data[s.layers[p]])
        self.num_copies += 1
        if queued is not None:
            self._landed[p] = queued
            self.times.copies.append(queued)

    def acquire(self, index: int) -> LayerWeights:
        s = self.schedule
        p = s.position.get(index)
        if p is None:
            return self.frames.views[self.frames.frame_of[index]]
        if self.copies.stream is None:
            t0 = time.perf_counter()
            self._issue(p)
            self.times.t_wait_s += time.perf_counter() - t0
        else:
            compute = torch.cuda.current_stream(self.copies.device)
            before = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            after = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            before.record(compute)
            compute.wait_event(self._landed.pop(p).done)
            after.record(compute)
            self.times.waits.append((before, after))
        return s.views[p % len(s.regions)]

    def release(self, index: int) -> None:
        s = self.schedule
        p = s.position.get(index)
        if p is not None and self.copies.stream is not None and p + len(s.regions) < len(s.layers):
            # The slot is free once this layer's kernels, queued by now, have run.
            self._issue(p + len(s.regions))


def measure_timing(host: PackedLayers, device: torch.device, *, repeats: int = 5) -> LayerTiming:
    """Priors for the remapping controller, measured on ``device``.

    T_T is the fastest of ``repeats`` host-to-device copies of one packed layer: what a
    copy costs uncontended, as the fastest run of a short timed loop is (a median of
    three, on a loaded host, now and then took a neighbour's burst for the copy and left
    a model lending no layer at all). Neither forward time is known before a pass has
    run, so both start at the fastest of ``repeats`` one-token products with each of a
    layer's weight matrices, times the layers: a decode pass does at least that, so the
    controller starts cautious until measured passes replace it. (Half a device-to-device
    copy of the layer, the bandwidth bound, was the prior before; on a CPU, where T_T is
    itself a memory copy, it put T_T at 2-3 layer times, on the edge of Eq. 4, and a
    loaded host tipped an idle model, which never runs a pass to correct it, into
    lending no layer.)
    """
    copies = CopyStream(device)
    scratch = torch.empty(host.packing.nbytes, dtype=torch.uint8, device=device)

    def timed(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(repeats):
            _synchronize(device)
            t0 = time.perf_counter()
            fn()
            _synchronize(device)
            copies.synchronize()
            times.append(time.perf_counter() - t0)
        return min(times)

    t_transfer = timed(lambda: copies.copy(scratch, host.data[0]))
    layer = host.packing.views(scratch)
    # A mixture's token runs its router and at least one expert.
    mlp = (
        (layer.gate_up, layer.down)
        if layer.router is None
        else (layer.router, layer.gate_up[0], layer.down[0])
    )
    matrices = (layer.qkv, layer.o_proj, *mlp)
    inputs = [torch.ones(w.shape[1], dtype=w.dtype, device=device) for w in matrices]
    t_layer = timed(lambda: [torch.mv(w, x) for w, x in zip(matrices, inputs, strict=True)])
    t_pass = max(t_layer, 1e-9) * len(host)
    return LayerTiming(max(t_transfer, 1e-9), t_pass, t_pass)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
