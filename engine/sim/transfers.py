"""SimulatedTransfers: DuplexKV's two copy streams on the virtual clock."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from shunter.engine.interfaces import Transfers
from shunter.engine.plan import BlockCopies, StepPlan
from shunter.engine.sim.clock import VirtualClock
from shunter.engine.sim.cost import CopyBatch, CopyCostModel


@dataclass
class HostToDeviceLink:
    """The host-to-device direction of the link, shared by every copy that crosses it:
    KV swap-ins (``SimulatedTransfers``) and weight copies (``sim.weights``). Copies
    take it in issue order, each for as long as it needs the link alone, so what is
    copied over any span of time never exceeds what the link moves in it; a copy that
    waits for the link delays what waits for the copy."""

    free_at: float = 0.0
    busy_s: float = 0.0

    def reserve(self, not_before: float, duration_s: float) -> float:
        """Take the link for ``duration_s`` from ``not_before`` or once it is free; when
        the copy lands."""
        start = max(self.free_at, not_before)
        self.free_at = start + duration_s
        self.busy_s += duration_s
        return self.free_at


@dataclass
class TransferTotals:
    """Everything the copy streams did in a run."""

    d2h_blocks: int = 0
    h2d_blocks: int = 0
    d2h_bytes: int = 0
    h2d_bytes: int = 0
    busy_s: float = 0.0


class SimulatedTransfers(Transfers):
    """Runs each plan's D2H and H2D batches as two concurrent batched copies.

    A step's two batches start together when submitted, or when the previous step's
    batches are done if those are still running (each stream is FIFO); their times come
    from ``CopyCostModel.duplex_times``. The H2D batch also waits for the host-to-device
    ``link`` (shared with weight copies). A step without copies completes with the steps
    before it, so steps complete in increasing order. ``pop_h2d_done(step)`` tells the
    simulated executor when a step's swap-ins have landed.
    """

    def __init__(
        self,
        clock: VirtualClock,
        copies: CopyCostModel,
        block_bytes: Mapping[str, int],
        link: HostToDeviceLink | None = None,
    ) -> None:
        self._clock = clock
        self._copies = copies
        self._block_bytes = dict(block_bytes)
        self.link = HostToDeviceLink() if link is None else link
        self._pending: deque[tuple[float, int]] = deque()  # (completion time, step)
        self._h2d_done: dict[int, float] = {}
        self._free_at = 0.0
        self.totals = TransferTotals()

    def _batch(self, *copies: Mapping[str, BlockCopies]) -> CopyBatch:
        """One batched copy: per model, its blocks in all of ``copies``."""
        counts: dict[str, int] = {}
        for by_model in copies:
            for model, blocks in by_model.items():
                counts[model] = counts.get(model, 0) + len(blocks)
        groups = tuple((n, self._block_bytes[m]) for m, n in counts.items() if n)
        return CopyBatch(groups)

    def submit(self, plan: StepPlan) -> None:
        now = self._clock.now()
        d2h, h2d = self._batch(plan.swap_out, plan.rotate), self._batch(plan.swap_in)
        start = max(now, self._free_at)
        if d2h.is_empty and h2d.is_empty:
            done = h2d_done = start
        else:
            d2h_s, h2d_s = self._copies.duplex_times(d2h, h2d)
            h2d_done = self.link.reserve(start, h2d_s) if h2d_s > 0 else start
            done = max(start + d2h_s, h2d_done)
            self._free_at = done
            self.totals.busy_s += done - start
        self.totals.d2h_blocks += plan.num_d2h_blocks
        self.totals.h2d_blocks += plan.num_h2d_blocks
        self.totals.d2h_bytes += d2h.total_bytes
        self.totals.h2d_bytes += h2d.total_bytes
        if not h2d.is_empty:
            self._h2d_done[plan.step] = h2d_done
        self._pending.append((done, plan.step))

    def poll(self, now: float) -> list[int]:
        done: list[int] = []
        while self._pending and self._pending[0][0] <= now:
            done.append(self._pending.popleft()[1])
        return done

    def pop_h2d_done(self, step: int) -> float | None:
        """When step ``step``'s swap-ins complete, asked once (the executor does, when
        it runs that step); None if it had none."""
        return self._h2d_done.pop(step, None)

    def next_completion(self) -> float | None:
        """The earliest completion time not yet reported by ``poll``, if any."""
        return self._pending[0][0] if self._pending else None
