"""SimulatedTransfers: DuplexKV's two copy streams on the virtual clock."""

from __future__ import annotations

import copy as shallow
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from shunter.engine.interfaces import Transfers
from shunter.engine.plan import BlockCopies, StepPlan
from shunter.engine.sim.clock import VirtualClock
from shunter.engine.sim.cost import CopyBatch, CopyCostModel

KV_STREAM = "kv"
WEIGHT_STREAM = "weights"
_LANDED_EPS_S = 1e-12  # what floating-point rounding leaves of a copy that has landed


@dataclass(eq=False)
class LinkCopy:
    """One copy on the host-to-device link, not to start before ``not_before``, taking
    ``duration_s`` on the link alone. ``started`` (the first copy
    of its stream, free to start) and ``landed`` are set once the link has settled past
    them (``HostToDeviceLink.landed`` and ``took`` project them before)."""

    not_before: float
    duration_s: float
    remaining_s: float = field(init=False)
    started: float | None = None
    landed: float | None = None

    def __post_init__(self) -> None:
        self.remaining_s = self.duration_s


def _run_link(queues: Mapping[str, deque[LinkCopy]], t: float, until: float) -> float:
    """Move the queued copies from ``t`` to ``until`` (``math.inf``: until the last
    lands): each stream copies its queue in order, and the streams with a copy under way
    share the link evenly. Sets ``landed`` on each copy that lands and pops it; returns
    the time reached."""
    while True:
        for queue in queues.values():
            while queue and queue[0].not_before <= t and queue[0].remaining_s <= _LANDED_EPS_S:
                copy = queue.popleft()
                copy.landed = t
                if copy.started is None:  # nothing to copy: it started as it landed
                    copy.started = t
        heads = [queue[0] for queue in queues.values() if queue]
        if not heads:
            return t if until == math.inf else max(t, until)
        active = [c for c in heads if c.not_before <= t]
        for c in active:
            if c.started is None:
                c.started = t
        waiting = [c.not_before for c in heads if c.not_before > t]
        share = len(active)
        first = min(active, key=lambda c: c.remaining_s) if active else None
        lands = math.inf if first is None else t + first.remaining_s * share
        next_t = min([lands, *waiting])
        if next_t > until:
            for c in active:
                c.remaining_s -= (until - t) / share
            return until
        for c in active:
            c.remaining_s -= (next_t - t) / share
        if first is not None and next_t == lands:
            first.remaining_s = 0.0  # exactly, whatever the rounding above left
        t = next_t


class HostToDeviceLink:
    """The host-to-device direction of the link, shared by every copy that crosses it:
    KV swap-ins on one stream (``SimulatedTransfers``), weight copies on another
    (``sim.weights``), as the CUDA executor issues them (its swap-in stream and its
    slots' copy stream). Each stream copies in issue order; streams with a copy under
    way share the link evenly (a fluid model: k busy streams move at 1/k of the link
    each), so together they never move more than the link does, and a copy on one
    stream waits for its own stream's queue but not for the whole of another's.

    Another stream's later copies slow one already issued, so a copy's landing is
    projected from what has been issued so far (``landed``), and final once the link has
    settled past it (``settle(now)``: nothing issued from then on starts before ``now``).
    """

    def __init__(self) -> None:
        self._queues: dict[str, deque[LinkCopy]] = {}
        self._t = 0.0  # settled up to here
        self._projected: dict[LinkCopy, LinkCopy] | None = None  # copy -> run ahead
        self.busy_s = 0.0  # the copies' time on the link alone, summed

    def issue(self, stream: str, not_before: float, duration_s: float) -> LinkCopy:
        """Queue a copy of ``duration_s`` (on the link alone) on ``stream``, to start at
        ``not_before`` or later (never before where the link has settled)."""
        copy = LinkCopy(max(not_before, self._t), duration_s)
        self._queues.setdefault(stream, deque()).append(copy)
        self._projected = None
        self.busy_s += duration_s
        return copy

    def settle(self, now: float) -> None:
        """Run the link up to ``now``: every copy landed by then is final. The caller
        issues nothing to start before ``now`` from then on."""
        if now > self._t:
            self._t = _run_link(self._queues, self._t, now)
            self._projected = None

    def _run_ahead(self, copy: LinkCopy) -> LinkCopy:
        """``copy`` itself once it has landed, else a copy of it run to its landing from
        the copies issued so far."""
        if copy.landed is not None:
            return copy
        if self._projected is None:
            clones = {c: shallow.copy(c) for q in self._queues.values() for c in q}
            queues = {s: deque(clones[c] for c in q) for s, q in self._queues.items()}
            _run_link(queues, self._t, math.inf)
            self._projected = clones
        return self._projected[copy]

    def landed(self, copy: LinkCopy) -> float:
        """When ``copy`` lands: final once settled, else projected from the copies
        issued so far."""
        landed = self._run_ahead(copy).landed
        return math.inf if landed is None else landed

    def took(self, copy: LinkCopy) -> float:
        """How long ``copy`` took on the link, from when its stream was free for it and
        it could start to its landing (longer than ``duration_s`` while it shared the
        link); projected like ``landed``."""
        ran = self._run_ahead(copy)
        if ran.landed is None or ran.started is None:
            return math.inf
        return ran.landed - ran.started


@dataclass
class TransferTotals:
    """Everything the copy streams did in a run."""

    d2h_blocks: int = 0
    h2d_blocks: int = 0
    d2h_bytes: int = 0
    h2d_bytes: int = 0


class SimulatedTransfers(Transfers):
    """Runs each plan's D2H and H2D batches as two concurrent batched copies.

    A step's two batches start together when submitted, or when the previous step's
    batches are done if those are still running (each stream is FIFO); their times come
    from ``CopyCostModel.duplex_times``. The H2D batch is a copy on the host-to-device
    ``link``'s KV stream, sharing the link with weight copies, so when it lands is known
    for sure only once the link has settled past it (``HostToDeviceLink``). A step
    without copies completes with the steps before it, so steps complete in increasing
    order. ``pop_h2d_done(step)`` hands the simulated executor a step's swap-in copy, to
    ask the link when it lands.
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
        # (when its D2H batch lands, its H2D copy if any, step)
        self._pending: deque[tuple[float, LinkCopy | None, int]] = deque()
        self._h2d: dict[int, LinkCopy] = {}
        self._last_done = 0.0  # when the last step reported by poll completed
        self.totals = TransferTotals()

    def _batch(self, *copies: Mapping[str, BlockCopies]) -> CopyBatch:
        """One batched copy: per model, its blocks in all of ``copies``."""
        counts: dict[str, int] = {}
        for by_model in copies:
            for model, blocks in by_model.items():
                counts[model] = counts.get(model, 0) + len(blocks)
        groups = tuple((n, self._block_bytes[m]) for m, n in counts.items() if n)
        return CopyBatch(groups)

    def _done(self, d2h_done: float, h2d: LinkCopy | None) -> float:
        """When a step's batches complete, as projected now: not before the steps
        already reported."""
        landed = d2h_done if h2d is None else self.link.landed(h2d)
        return max(self._last_done, d2h_done, landed)

    def _free_at(self) -> float:
        """When the batches submitted so far complete, as projected now."""
        return max([self._last_done, *(self._done(d, h) for d, h, _ in self._pending)])

    def submit(self, plan: StepPlan) -> None:
        now = self._clock.now()
        d2h, h2d = self._batch(plan.swap_out, plan.rotate), self._batch(plan.swap_in)
        start = max(now, self._free_at())
        d2h_done, h2d_copy = start, None
        if not (d2h.is_empty and h2d.is_empty):
            d2h_s, h2d_s = self._copies.duplex_times(d2h, h2d)
            d2h_done = start + d2h_s
            if h2d_s > 0:
                h2d_copy = self.link.issue(KV_STREAM, start, h2d_s)
                self._h2d[plan.step] = h2d_copy
        self.totals.d2h_blocks += plan.num_d2h_blocks
        self.totals.h2d_blocks += plan.num_h2d_blocks
        self.totals.d2h_bytes += d2h.total_bytes
        self.totals.h2d_bytes += h2d.total_bytes
        self._pending.append((d2h_done, h2d_copy, plan.step))

    def poll(self, now: float) -> list[int]:
        self.link.settle(now)
        done: list[int] = []
        while self._pending:
            d2h_done, h2d, step = self._pending[0]
            end = self._done(d2h_done, h2d)
            if end > now:
                break
            self._pending.popleft()
            self._last_done = end
            done.append(step)
        return done

    def pop_h2d_done(self, step: int) -> LinkCopy | None:
        """Step ``step``'s swap-in copy, asked once (the executor does, when it runs
        that step; the link says when it lands); None if it had none."""
        return self._h2d.pop(step, None)

    def next_completion(self) -> float | None:
        """The earliest completion not yet reported by ``poll``, as projected now."""
        if not self._pending:
            return None
        d2h_done, h2d, _ = self._pending[0]
        return self._done(d2h_done, h2d)
