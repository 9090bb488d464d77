"""Moving KV capacity: chunks back to the arena, and weight frames lent and taken back.

The part of ``KVMemory`` that changes which pages are KV: ``compact`` and
``release_empty`` give a model's chunks back so another model can claim them;
``release_frame`` hands a decoder layer's weight frame to the KV cache, ``vacate_frame``
takes it back (moving live blocks out device-to-device first) and ``cancel_vacate``
gives up on that. Moves are recorded into the current step's plan, fenced until the
step completes.
"""

from __future__ import annotations

from collections.abc import Iterable

from shunter.engine.memory.arena import FREE, Arena, PageOwner
from shunter.engine.memory.inflight import InFlight
from shunter.engine.memory.pool import BlockPool
from shunter.engine.memory.table import BlockTable
from shunter.engine.memory.weights import WeightLayout
from shunter.engine.plan import BlockMove, StepPlan


class Relocation:
    """Capacity moves over the state ``KVMemory`` keeps (declared here, set there)."""

    arena: Arena
    weights: dict[str, WeightLayout]
    _pools: dict[str, BlockPool]
    _tables: dict[str, BlockTable]
    _inflight: InFlight
    _plan: StepPlan | None
    _moved_into: dict[str, dict[int, int]]  # model -> {block moved into this step: source}
    _vacating: dict[tuple[str, int], list[tuple[BlockPool, int]]]

    def compact(self, model: str, num_bytes: int | None = None) -> int:
        """Give the model's chunks back to the arena, enough for ``num_bytes`` (what the
        others lack; everything it can without); return the pages given back.

        Call it after the step's other verbs. Empty chunks go back at once, the highest
        first, as many as ``num_bytes`` needs: the rest stay with the model, so an idle
        model keeps its capacity until another needs it, and no chunk is given back only
        to be claimed again. When that is not enough and the model's free blocks would
        hold a whole chunk's, its highest chunk with live blocks drains (nothing is
        allocated from it again) and, when none of them awaits a copy, has them moved
        into free blocks elsewhere (``plan.moves``); their sources are freed when the
        step completes, so a later call gives it back.
        """
        pool = self._pools[model]
        limit = None if num_bytes is None else -(-num_bytes // pool.chunk_bytes)
        released = pool.release_empty(limit)
        covered = limit is not None and released >= limit
        if covered or pool.num_held_free < pool.blocks_per_chunk:
            return released * pool.pages_per_chunk
        chunk = max(pool.held_chunks)
        draining = pool.is_draining(chunk)
        pool.drain(chunk)
        if not self._move_out(pool, [chunk], claim=False) and not draining:
            pool.undrain(chunk)
        return released * pool.pages_per_chunk

    def release_empty(self, model: str) -> int:
        """Give every held chunk of the model without a used block back to the arena;
        return the pages given back."""
        pool = self._pools[model]
        return pool.release_empty() * pool.pages_per_chunk

    # -- weight frames (remapping) ------------------------------------------------------
    def frame_pages(self, model: str, frame: int) -> range:
        """The pages of decoder layer ``frame``'s weights as placed at start."""
        return self.weights[model].layers[frame]

    def frame_bytes(self, model: str) -> int:
        """Bytes of one weight frame (every decoder layer of a model has the same)."""
        return len(self.weights[model].layers[0]) * self.arena.page_bytes

    def release_frame(self, model: str, frame: int) -> None:
        """Hand a weight frame's pages to the KV cache (they become free pages)."""
        self.arena.convert(self.frame_pages(model, frame), PageOwner.weights(model, frame), FREE)

    def frame_costs(self, model: str, frames: Iterable[int]) -> dict[int, int]:
        """Live KV blocks in chunks over each released frame: what taking it back moves."""
        used = [(pool, pool.num_used_per_chunk()) for pool in self._pools.values()]
        return {
            f: sum(
                counts[c]
                for pool, counts in used
                for c in pool.chunks_over(self.frame_pages(model, f))
            )
            for f in frames
        }

    def vacate_frame(self, model: str, frame: int) -> bool:
        """Take a released frame back for weights, as far as possible this step.

        Free pages of the frame become weights at once (so no pool claims them);
        chunks over it drain, release when empty and have their live blocks moved out
        (``plan.moves``, freed when the step completes) when they fit elsewhere and
        none awaits a copy. Returns True once every page holds weights again: then the
        frame may be loaded. ``cancel_vacate`` gives a partly taken frame back.
        """
        pages, owner = self.frame_pages(model, frame), PageOwner.weights(model, frame)

        def grab() -> None:
            self.arena.convert([p for p in pages if self.arena.owner(p) is FREE], FREE, owner)

        grab()  # before any move, so no pool claims the frame's free pages
        chunks = self._vacating.setdefault((model, frame), [])
        chunks[:] = [(pool, c) for pool, c in chunks if pool.holds(c)]  # others emptied
        for pool in self._pools.values():
            for c in pool.chunks_over(pages):
                if (pool, c) not in chunks:
                    pool.drain(c)
                    chunks.append((pool, c))
        # Pools in the order of their first chunk, not a set's: a set of pools iterates
        # by object address, and the order pools move out in decides which blocks each
        # claims, so runs would differ from process to process.
        used = {pool: pool.num_used_per_chunk() for pool in dict.fromkeys(p for p, _ in chunks)}
        for pool, c in list(chunks):
            if used[pool][c] == 0:
                pool.release(c)
                chunks.remove((pool, c))
        # The chunks just given back are free pages of the frame: they become weights
        # before any move claims chunks, or the moves would claim them and put the live
        # blocks back into the frame, to be moved out again next step, and so forever.
        grab()
        for pool in used:
            self._move_out(pool, [c for p, c in chunks if p is pool], claim=True)
        grab()
        if chunks:
            return False
        del self._vacating[(model, frame)]
        return True

    def cancel_vacate(self, model: str, frame: int) -> None:
        """Give back what ``vacate_frame`` took of a frame that stays released (its
        pages holding weights become free again)."""
        pages, owner = self.frame_pages(model, frame), PageOwner.weights(model, frame)
        for pool, c in self._vacating.pop((model, frame), []):
            pool.undrain(c)
        self.arena.convert([p for p in pages if self.arena.owner(p) == owner], owner, FREE)

    def _move_out(self, pool: BlockPool, chunks: list[int], *, claim: bool) -> int:
        """Plan moves of draining chunks' live blocks into free blocks elsewhere (in
        held chunks, or also in claimed ones with ``claim``), chunk by chunk while they
        fit; a chunk with a block awaiting a copy stays. Returns the chunks emptied."""
        if not chunks:
            return 0
        model, plan, bpc = pool.model, self._current(), pool.blocks_per_chunk
        wanted = set(chunks)
        # chunk -> block -> the (table, index) places holding it (several when shared)
        owners: dict[int, dict[int, list[tuple[BlockTable, int]]]] = {c: {} for c in chunks}
        for t in self._tables.values():
            if t.model == model:
                for i, d in enumerate(t.devices):
                    if d // bpc in wanted:
                        owners[d // bpc].setdefault(d, []).append((t, i))
        used = pool.num_used_per_chunk()
        # Moves planned this step may add to each other, but a block moved here this step
        # does not move again (one batch of moves reads every source before writing);
        # no other copy may be in flight. A shared block moves only when every holder
        # is a table here: one whose free awaits a copy would free its source again.
        moved_here = self._moved_into.setdefault(model, {})
        emptied = 0
        for chunk in chunks:
            blocks = owners[chunk]
            busy = any(
                d in moved_here
                or pool.num_holders(d) != len(places)
                or any(
                    self._fence(t.d2h_step, t.h2d_step) is not None
                    or (t.move_step != plan.step and self._inflight.is_pending(t.move_step))
                    for t, _ in places
                )
                for d, places in blocks.items()
            )
            room = pool.num_free if claim else pool.num_held_free
            if busy or len(blocks) != used[chunk] or room < len(blocks):
                continue
            emptied += 1
            if not blocks:
                continue
            moves = plan.moves.setdefault(model, [])
            self._inflight.touch(plan.step)
            dsts = pool.allocate(len(blocks), claim=claim)
            for (src, places), dst in zip(blocks.items(), dsts, strict=True):
                moved_here[dst] = src
                moves.append(BlockMove(src, dst))
                pool.moved(src, dst)
                self._inflight.defer_device(plan.step, model, [src])
                for table, i in places:
                    table.devices[i] = dst
                    table.move_step = plan.step
        return emptied

    # -- internals -------------------------------------------------------------------------
    def _copy_sources(self, model: str, ids: list[int]) -> list[int]:
        """The blocks a D2H copy of this step reads for the device blocks ``ids``.

        The executor runs a step's moves after its copies were submitted, so a block
        moved into this step does not hold its KV yet when they read it: its move's
        source still does (fenced until the step completes, so nothing reuses it first).
        """
        moved = self._moved_into.get(model)
        if not moved:
            return ids
        return [moved.get(d, d) for d in ids]

    def _current(self) -> StepPlan:
        if self._plan is None:
            raise RuntimeError("copies are planned between begin_step and end_step")
        return self._plan

    def _fence(self, *steps: int) -> int | None:
        """The latest of ``steps`` whose copies are still in flight, if any."""
        return self._inflight.latest_pending(*steps)
