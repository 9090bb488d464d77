"""What ``shunter engine calibrate`` measures about the device itself and its host link.

- **Host link**: host-to-device (H2D) and device-to-host (D2H) bandwidth by copy size,
  each direction alone and both at once (full duplex), and the host-side cost of
  issuing one copy. On CUDA the host side is pinned memory registered in large chunks
  (``pinned_empty``, like the KV swap space), H2D copies run on one stream and D2H copies
  on another (as ``CudaTransfers`` issues them), and times come from CUDA events. A spin
  kernel holds the copy streams until every copy of a measurement is queued, so the
  figures are the link's, not the host's enqueue rate (that is ``launch_s``). On CPU the
  "device" is host memory: a copy is a memcpy timed on the host clock, its call cost
  included, and duplex runs the two directions on two threads (torch releases the GIL
  while it copies).
- **Device memory bandwidth**: a large device-to-device copy, read plus written bytes.
- **Dense GEMM throughput**: a square matrix product.

A bandwidth timing moves up to ``MAX_COPIES`` copies of one size back to back, at
consecutive offsets of buffers larger than the copies, so that small copies are not
served again and again from one cached region. Every figure is a median over
``repeats`` timings, after one untimed run.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

Direction = Literal["h2d", "d2h"]
Views = list[tuple[torch.Tensor, torch.Tensor]]  # (destination, source) of each copy

# Most copies in one timing: enough to amortize the timer for 64 KiB copies, few enough
# that queueing them takes far less time than the spin that holds the streams.
MAX_COPIES = 256
# Spin before a CUDA timing, in GPU clock cycles (~10 ms near 2 GHz): longer than the
# host needs to queue 2 x MAX_COPIES copies, a few microseconds each.
SPIN_CYCLES = 20_000_000
# Copies whose host-side issue cost ``launch_s`` measures, and their size.
LAUNCH_COPIES = 200
LAUNCH_BYTES = 64


@dataclass(frozen=True)
class CopyPoint:
    """Bandwidths in bytes/s for copies of ``size`` bytes: ``h2d`` and ``d2h`` each
    direction alone; ``duplex`` the bytes of both directions moved per second while
    both run at once."""

    size: int
    h2d: float
    d2h: float
    duplex: float


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(device: torch.device, fn: Callable[[], object], *, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after one untimed run: CUDA events
    on the current stream, else the host clock."""
    fn()
    times: list[float] = []
    for _ in range(repeats):
        if device.type == "cuda":
            stream = torch.cuda.current_stream(device)
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


class CopyBench:
    """Buffers (and, on CUDA, two copy streams) for timing copies of up to ``max_bytes``
    between host and ``device``; copies smaller than ``span_bytes`` cycle through that
    many bytes."""

    def __init__(self, device: torch.device, max_bytes: int, *, span_bytes: int = 0) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.device = device
        self.nbytes = max(max_bytes, span_bytes)
        cuda = device.type == "cuda"
        self.host_src = self._host(cuda)
        self.host_dst = self._host(cuda)
        self.dev_src = torch.ones(self.nbytes, dtype=torch.uint8, device=device)
        self.dev_dst = torch.ones(self.nbytes, dtype=torch.uint8, device=device)
        self.streams: dict[Direction, torch.cuda.Stream] = {}
        if cuda:
            self.streams = {d: torch.cuda.Stream(device) for d in ("h2d", "d2h")}  # type: ignore[no-untyped-call]

    def _host(self, pinned: bool) -> torch.Tensor:
        if pinned:
            from shunter.engine.exec.cuda_transfers import pinned_empty

            return pinned_empty((self.nbytes,), torch.uint8).fill_(1)
        # Written once, so that no timing pays for first-touch page faults.
        return torch.ones(self.nbytes, dtype=torch.uint8)

    def views(self, direction: Direction, size: int, copies: int) -> Views:
        """``copies`` (destination, source) pairs of ``size`` bytes at consecutive offsets."""
        if not 0 < size <= self.nbytes:
            raise ValueError(f"copy size {size} outside 1..{self.nbytes}")
        src, dst = (
            (self.host_src, self.dev_dst) if direction == "h2d" else (self.dev_src, self.host_dst)
        )
        span = self.nbytes // size * size
        offsets = [i * size % span for i in range(copies)]
        return [(dst[o : o + size], src[o : o + size]) for o in offsets]

    def run_seconds(self, jobs: Sequence[tuple[Direction, Views]]) -> list[float]:
        """Start every job's copies at once; seconds until each job's last copy is done."""
        if self.device.type == "cuda":
            return self._cuda_seconds(jobs)
        if len(jobs) == 1:
            t0 = time.perf_counter()
            _copy_all(jobs[0][1], non_blocking=False)
            return [time.perf_counter() - t0]
        return _threaded_seconds([views for _, views in jobs])

    def _cuda_seconds(self, jobs: Sequence[tuple[Direction, Views]]) -> list[float]:
        compute = torch.cuda.current_stream(self.device)
        # Hold the copy streams behind a spin until all their copies are queued.
        torch.cuda._sleep(SPIN_CYCLES)  # type: ignore[no-untyped-call]
        gate = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        gate.record(compute)
        ends = []
        for direction, views in jobs:
            stream = self.streams[direction]
            stream.wait_event(gate)
            with torch.cuda.stream(stream):
                _copy_all(views, non_blocking=True)
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end.record(stream)
            ends.append(end)
        for end in ends:
            end.synchronize()
        return [gate.elapsed_time(end) / 1e3 for end in ends]

    def point(self, size: int, *, repeats: int) -> CopyPoint:
        """Median bandwidths for copies of ``size`` bytes: H2D, D2H, and both at once."""
        copies = max(1, min(MAX_COPIES, self.nbytes // size))
        h2d = self.views("h2d", size, copies)
        d2h = self.views("d2h", size, copies)
        moved = size * copies

        def rates() -> tuple[float, float, float]:
            (t_h2d,) = self.run_seconds([("h2d", h2d)])
            (t_d2h,) = self.run_seconds([("d2h", d2h)])
            both = self.run_seconds([("h2d", h2d), ("d2h", d2h)])
            return moved / t_h2d, moved / t_d2h, 2 * moved / max(both)

        rates()  # untimed: first use of these buffers and streams
        runs = [rates() for _ in range(repeats)]
        return CopyPoint(
            size=size,
            h2d=statistics.median(r[0] for r in runs),
            d2h=statistics.median(r[1] for r in runs),
            duplex=statistics.median(r[2] for r in runs),
        )

    def seconds(self, direction: Direction, size: int, *, repeats: int) -> float:
        """Median seconds of one copy of ``size`` bytes (e.g. one weight layer)."""
        views = self.views(direction, size, 1)
        self.run_seconds([(direction, views)])
        return statistics.median(self.run_seconds([(direction, views)])[0] for _ in range(repeats))

    def launch_s(self, *, repeats: int) -> float:
        """Median host seconds to issue one small H2D copy call. On CUDA the copies queue
        behind a spin, so this is the issue cost alone; on CPU the call copies too."""
        size = min(LAUNCH_BYTES, self.nbytes)
        views = self.views("h2d", size, LAUNCH_COPIES)
        cuda = self.device.type == "cuda"
        times = []
        for _ in range(repeats + 1):
            synchronize(self.device)
            if cuda:
                stream = self.streams["h2d"]
                with torch.cuda.stream(stream):
                    torch.cuda._sleep(SPIN_CYCLES // 4)  # type: ignore[no-untyped-call]
                    t0 = time.perf_counter()
                    _copy_all(views, non_blocking=True)
                    times.append(time.perf_counter() - t0)
            else:
                t0 = time.perf_counter()
                _copy_all(views, non_blocking=False)
                times.append(time.perf_counter() - t0)
        synchronize(self.device)
        return statistics.median(times[1:]) / LAUNCH_COPIES


def _copy_all(views: Views, *, non_blocking: bool) -> None:
    for dst, src in views:
        dst.copy_(src, non_blocking=non_blocking)


def _threaded_seconds(jobs: Sequence[Views]) -> list[float]:
    """Run each job's copies on its own thread, all released together; seconds until
    each finished."""
    barrier = threading.Barrier(len(jobs) + 1)
    ends = [0.0] * len(jobs)

    def run(k: int, views: Views) -> None:
        barrier.wait()
        _copy_all(views, non_blocking=False)
        ends[k] = time.perf_counter()

    threads = [threading.Thread(target=run, args=(k, v)) for k, v in enumerate(jobs)]
    for thread in threads:
        thread.start()
    barrier.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    return [end - t0 for end in ends]


def device_bandwidth(device: torch.device, nbytes: int, *, repeats: int) -> float:
    """Device memory bytes/s: a device-to-device copy of ``nbytes`` reads and writes them."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / median_seconds(device, lambda: dst.copy_(src), repeats=repeats)


def matmul_flops(device: torch.device, n: int, dtype: torch.dtype, *, repeats: int) -> float:
    """Dense GEMM FLOP/s: an ``n x n`` by ``n x n`` product in ``dtype``."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=gen, device=device).to(dtype)
    b = torch.randn(n, n, generator=gen, device=device).to(dtype)
    out = torch.empty(n, n, dtype=dtype, device=device)
    return 2 * n**3 / median_seconds(device, lambda: torch.mm(a, b, out=out), repeats=repeats)
