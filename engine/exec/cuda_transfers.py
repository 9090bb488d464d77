"""DuplexKV's transfer engine on a CUDA device: full-duplex, batched, event-tracked copies.

- **Pinned host swap space** is one plain host allocation registered with the driver
  whole (``cudaHostRegister``). Torch's pinned allocator rounds every allocation
  up to a power of two, which for swap spaces of hundreds of GB wastes most of a tier.
- **Two copy streams**: D2H copies on one, H2D copies on the other, so both directions
  of the interconnect run at once, and both overlap the forward pass on the compute
  stream.
- **One batch per direction per step**: the device side gathers (D2H) or scatters (H2D)
  all of a model's blocks through a staging buffer with one indexing kernel, and the
  host side moves in runs of consecutive host block ids, one ``cudaMemcpyAsync`` per
  run. ``HostSwap`` hands out host ids consecutively, so a step's batch is usually one
  or a few runs of many blocks (the large copies the interconnect needs).
- **Events per step**: ``poll`` reports a step once the events recorded after its
  batches have completed; the compute stream waits on a swapped-in request's H2D event
  before a forward pass reads its KV (``wait_swapped_in``).

Ordering on the device: both copy streams first wait for the work already queued on
the compute stream (D2H sources were written by earlier forward passes; H2D
destinations are blocks freed since, which earlier passes may still read). The forward
pass queued after ``submit`` touches neither: D2H sources are SYNCED blocks or blocks of
preempted requests, H2D destinations belong to requests that join the next step. The
engine's fences keep the two directions apart (``Transfers`` contract).
"""

from __future__ import annotations

import math
import mmap
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from shunter.engine.exec.transfers import KVTransfers
from shunter.engine.plan import BlockCopies, StepPlan

# Device staging per direction; larger batches move through it in several rounds, each
# still one gather kernel and copies of many blocks.
STAGING_BYTES = 64 * 1024 * 1024


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized host tensor registered with the CUDA driver (page-locked).

    The allocation is aligned to a host page and registered whole, in one call: a copy
    may then span any range of it (a range over two separate registrations is refused
    by the driver with ``cudaErrorInvalidValue``). It is unregistered when the returned
    tensor is garbage collected, after the device finished its work.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    page = mmap.PAGESIZE
    raw = torch.empty(nbytes + page, dtype=torch.uint8)
    start = -raw.data_ptr() % page
    data = raw[start : start + nbytes]
    registered = [data.data_ptr()]
    _check(_cudart().cudaHostRegister(registered[0], nbytes, 0), "register")
    tensor = data.view(dtype).view(shape)
    # The finalizer holds ``raw``: the memory outlives its registration.
    weakref.finalize(tensor, _unregister, registered, raw).atexit = False
    return tensor


def _cudart() -> Any:
    """The CUDA runtime bindings (untyped in torch)."""
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


def _check(error: object, what: str) -> None:
    code = int(error)  # type: ignore[call-overload]
    if code != 0:
        raise RuntimeError(f"cudaHost{what.capitalize()} failed with cudaError {code}")


def _unregister(pointers: list[int], memory: torch.Tensor) -> None:
    """Unregister the pages at ``pointers``; ``memory`` (their allocation) is held by the
    caller until this returns."""
    if pointers:
        torch.cuda.synchronize()  # no copy may still use the pages
    cudart = _cudart()
    for ptr in pointers:
        _check(cudart.cudaHostUnregister(ptr), "unregister")


@dataclass
class _StepCopies:
    step: int
    d2h: torch.cuda.Event | None
    h2d: torch.cuda.Event | None
    swapped_in: list[str]

    def done(self) -> bool:
        return all(e is None or e.query() for e in (self.d2h, self.h2d))  # type: ignore[no-untyped-call]


class CudaTransfers(KVTransfers):
    """Overlapped KV copies on a D2H and an H2D stream (see the module docstring).

    ``host_kv`` tensors should be pinned (``host_swap_space(pin=True)``); pageable ones
    still copy correctly, but synchronously. Steps are reported in submission order.
    """

    def __init__(
        self,
        device_kv: Mapping[str, torch.Tensor],
        host_kv: Mapping[str, torch.Tensor],
        *,
        staging_bytes: int = STAGING_BYTES,
    ) -> None:
        super().__init__(device_kv, host_kv)
        devices = {kv.device for kv in self.device_kv.values()}
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            raise ValueError(f"CudaTransfers needs KV on one CUDA device, got {devices}")
        self.device = next(iter(devices))
        largest_block = max(kv[0].nbytes for kv in self.device_kv.values())
        staging_bytes = max(staging_bytes, largest_block)
        self.d2h_stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        self.h2d_stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        # Each staging buffer is only ever used on its own stream.
        with torch.cuda.stream(self.d2h_stream):
            self._d2h_staging = torch.empty(staging_bytes, dtype=torch.uint8, device=self.device)
        with torch.cuda.stream(self.h2d_stream):
            self._h2d_staging = torch.empty(staging_bytes, dtype=torch.uint8, device=self.device)
        self._pending: deque[_StepCopies] = deque()
        self._h2d_events: dict[str, torch.cuda.Event] = {}

    def add_model(self, model: str, device_kv: torch.Tensor, host_kv: torch.Tensor) -> None:
        """One more model on this device; the staging buffers grow to hold its block."""
        if device_kv.device != self.device:
            raise ValueError(f"model {model!r}: its KV is not on {self.device}")
        super().add_model(model, device_kv, host_kv)
        block = device_kv[0].nbytes
        if block > self._d2h_staging.numel():
            # Allocated on their own streams: the old buffers return to the allocator
            # ordered after the copies already queued there.
            with torch.cuda.stream(self.d2h_stream):
                self._d2h_staging = torch.empty(block, dtype=torch.uint8, device=self.device)
            with torch.cuda.stream(self.h2d_stream):
                self._h2d_staging = torch.empty(block, dtype=torch.uint8, device=self.device)

    def submit(self, plan: StepPlan) -> None:
        compute = torch.cuda.current_stream(self.device)
        d2h = [(model, copies) for model in self.device_kv if (copies := plan.d2h(model))]
        h2d = [(model, copies) for model, copies in plan.swap_in.items() if copies]
        d2h_event = h2d_event = None
        if d2h:
            self.d2h_stream.wait_stream(compute)
            with torch.cuda.stream(self.d2h_stream):
                for model, copies in d2h:
                    self._to_host(model, copies)
                d2h_event = _record(self.d2h_stream)
        if h2d:
            self.h2d_stream.wait_stream(compute)
            with torch.cuda.stream(self.h2d_stream):
                for model, copies in h2d:
                    self._to_device(model, copies)
                h2d_event = _record(self.h2d_stream)
            for request_id in plan.copied_in:
                self._h2d_events[request_id] = h2d_event
        swapped_in = plan.copied_in if h2d else []
        self._pending.append(_StepCopies(plan.step, d2h_event, h2d_event, swapped_in))

    def poll(self, now: float) -> list[int]:
        done = []
        while self._pending and self._pending[0].done():
            step = self._pending.popleft()
            done.append(step.step)
            for request_id in step.swapped_in:
                # The executor's thread may pop it meanwhile (async scheduling).
                if self._h2d_events.get(request_id) is step.h2d:
                    self._h2d_events.pop(request_id, None)
        return done

    def wait_swapped_in(self, request_ids: Iterable[str]) -> None:
        """Make the compute stream wait for these requests' pending H2D copies."""
        compute = torch.cuda.current_stream(self.device)
        waited: set[int] = set()
        for request_id in request_ids:
            event = self._h2d_events.pop(request_id, None)
            if event is not None and id(event) not in waited:
                compute.wait_event(event)
                waited.add(id(event))

    def synchronize(self) -> None:
        self.d2h_stream.synchronize()
        self.h2d_stream.synchronize()

    @property
    def num_pending_steps(self) -> int:
        return len(self._pending)

    def _to_host(self, model: str, copies: BlockCopies) -> None:
        kv, host = self.device_kv[model], self.host_kv[model]
        staging = _blocks_view(self._d2h_staging, kv)
        devices, hosts = _by_host(copies)
        for start in range(0, len(hosts), staging.shape[0]):
            end = start + staging.shape[0]
            part = hosts[start:end]
            stage = staging[: len(part)]
            torch.index_select(kv, 0, self._index(devices[start:end]), out=stage)
            for offset, first, n in _runs(part):
                host[first : first + n].copy_(stage[offset : offset + n], non_blocking=True)

    def _to_device(self, model: str, copies: BlockCopies) -> None:
        kv, host = self.device_kv[model], self.host_kv[model]
        staging = _blocks_view(self._h2d_staging, kv)
        devices, hosts = _by_host(copies)
        for start in range(0, len(hosts), staging.shape[0]):
            end = start + staging.shape[0]
            part = hosts[start:end]
            stage = staging[: len(part)]
            for offset, first, n in _runs(part):
                stage[offset : offset + n].copy_(host[first : first + n], non_blocking=True)
            kv.index_copy_(0, self._index(devices[start:end]), stage)

    def _index(self, ids: list[int]) -> torch.Tensor:
        # Called under the copy stream: the index lives and dies on that stream.
        return torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True)


def _record(stream: torch.cuda.Stream) -> torch.cuda.Event:
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record(stream)
    return event


def _blocks_view(staging: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """The staging bytes as whole blocks shaped like ``kv``'s."""
    block_bytes = kv[0].nbytes
    capacity = staging.numel() // block_bytes
    return staging[: capacity * block_bytes].view(kv.dtype).view(capacity, *kv.shape[1:])


def _by_host(copies: BlockCopies) -> tuple[list[int], list[int]]:
    """The copies' device and host ids, both in increasing host id order (stable), so
    consecutive host ids form runs."""
    hosts = copies.hosts
    order = sorted(range(len(hosts)), key=hosts.__getitem__)
    devices = copies.devices
    return [devices[i] for i in order], [hosts[i] for i in order]


def _runs(sorted_ids: list[int]) -> Iterator[tuple[int, int, int]]:
    """``(offset, first_id, length)`` of each run of consecutive ids."""
    offset = 0
    while offset < len(sorted_ids):
        end = offset + 1
        while end < len(sorted_ids) and sorted_ids[end] == sorted_ids[end - 1] + 1:
            end += 1
        yield offset, sorted_ids[offset], end - offset
        offset = end
