"""KVMemory: the one object the scheduler and the core use for KV memory.

It composes the arena, one block pool per model, the host swap space, block tables and
the in-flight fences, and offers paired verbs on requests. Like vLLM's KVCacheBlocks,
its answers are counts and ids: callers never touch tables or pools.

Copies and moves are recorded into the current step's StepPlan, between ``begin_step``
and ``end_step``; ``complete`` applies what the transfer engine reports done.
"""

from __future__ import annotations

from collections.abc import Iterable

from shunter.engine.config import EngineConfig
from shunter.engine.memory.arena import Arena
from shunter.engine.memory.host import HostSwap
from shunter.engine.memory.inflight import InFlight
from shunter.engine.memory.integrity import check_table
from shunter.engine.memory.pool import BlockPool
from shunter.engine.memory.table import NO_BLOCK, Block, BlockTable
from shunter.engine.memory.weights import place_weights
from shunter.engine.plan import BlockCopy, BlockMove, StepPlan
from shunter.engine.request import Request, RequestState


class KVMemory:
    """Device and host KV of every model of one engine.

    Verbs (each ``can_x`` answers whether ``x`` succeeds now):
      - ``allocate``: a WAITING request gets device blocks for all its tokens.
      - ``append``: a RUNNING request gets blocks for ``n`` more computed tokens.
      - ``swap_out``: RUNNING -> ROTARY. Copies to host only blocks without a valid
        (or landing) host copy; frees device blocks at once where a host copy exists,
        else when the copy completes.
      - ``swap_in``: ROTARY -> RUNNING: device blocks for all its tokens, one H2D copy
        per block with KV.
      - ``free``: forget the request's KV on both tiers (finished, aborted, or
        preempted to recompute).
      - ``rotate``: eager rotation of SYNCED blocks (budgeted, above the watermark).
    """

    def __init__(self, config: EngineConfig) -> None:
        self.block_tokens = config.block_tokens
        self.rotation = config.rotation
        self.arena = Arena(config.num_pages, config.page_bytes)
        self.weights = place_weights(self.arena, config.models)
        self.host = HostSwap(config.host_swap_bytes)
        self._pools: dict[str, BlockPool] = {}
        self._owners: dict[str, dict[int, Block]] = {}
        for spec in config.models:
            block_bytes = spec.block_bytes(config.block_tokens)
            self._pools[spec.name] = BlockPool(self.arena, spec.name, block_bytes)
            self._owners[spec.name] = {}
            self.host.register(spec.name, block_bytes)
        self._tables: dict[str, BlockTable] = {}
        self._inflight = InFlight()
        self._plan: StepPlan | None = None

    # -- counts for the scheduler --------------------------------------------------------
    def num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    def num_free_blocks(self, model: str) -> int:
        return self._pools[model].num_free

    def num_total_blocks(self, model: str) -> int:
        return self._pools[model].num_total

    def usage(self, model: str) -> float:
        """Share of the model's device KV capacity in use (1.0 when it has none)."""
        pool = self._pools[model]
        total = pool.num_total
        return 1.0 if total == 0 else 1.0 - pool.num_free / total

    def blocks_used(self) -> dict[str, int]:
        """Device KV blocks in use per model (owned or awaiting a copy)."""
        return {model: pool.num_used for model, pool in self._pools.items()}

    def blk(self, request: Request) -> int:
        """Blocks the request holds on the device (RUNNING) or needs there to run: one
        per block of all its known tokens (otherwise)."""
        if request.state is RequestState.RUNNING:
            return len(self._tables[request.id].blocks)
        return -(-request.num_tokens // self.block_tokens)

    def block_ids(self, request_id: str) -> list[int]:
        """Device block ids of a RUNNING request, in token order (for executors)."""
        return self._tables[request_id].device_ids()

    # -- steps ---------------------------------------------------------------------------
    def begin_step(self, plan: StepPlan) -> None:
        self._plan = plan

    def end_step(self) -> None:
        self._plan = None

    def complete(self, steps: Iterable[int]) -> None:
        """Steps whose copies completed: land host copies, do the deferred frees."""
        for step in steps:
            devices, hosts = self._inflight.complete(step)
            for model, device in devices:
                self._pools[model].free((device,))
            for model, host in hosts:
                self.host.free(model, (host,))

    @property
    def num_pending_steps(self) -> int:
        return self._inflight.num_pending_steps

    def _current(self) -> StepPlan:
        if self._plan is None:
            raise RuntimeError("copies are planned between begin_step and end_step")
        return self._plan

    # -- paired verbs ----------------------------------------------------------------------
    def can_allocate(self, request: Request) -> bool:
        return self._pools[request.model].can_allocate(self.num_blocks(request.num_tokens))

    def allocate(self, request: Request) -> None:
        if request.id in self._tables:
            raise ValueError(f"request {request.id!r} already has a block table")
        table = BlockTable(request.id, request.model)
        table.num_computed = request.num_computed_tokens
        self._tables[request.id] = table
        self._grow(table, self.num_blocks(request.num_tokens))

    def can_append(self, request: Request, num_new_tokens: int) -> bool:
        table = self._tables[request.id]
        need = self.num_blocks(request.num_computed_tokens + num_new_tokens) - len(table)
        return need <= 0 or self._pools[request.model].can_allocate(need)

    def append(self, request: Request, num_new_tokens: int) -> None:
        table = self._tables[request.id]
        need = self.num_blocks(request.num_computed_tokens + num_new_tokens) - len(table)
        if need > 0:
            self._grow(table, need)

    def can_swap_out(self, request: Request) -> bool:
        table = self._tables[request.id]
        keep = table.blocks[: self.num_blocks(request.num_computed_tokens)]
        need = sum(1 for b in keep if b.host == NO_BLOCK)
        return self.host.can_allocate(request.model, need)

    def swap_out(self, request: Request) -> None:
        table = self._tables[request.id]
        model, plan = table.model, self._current()
        keep = self.num_blocks(request.num_computed_tokens)
        for block in table.blocks[keep:]:
            self._drop_block(model, block)
        del table.blocks[keep:]
        ready = table.ready_step
        for block in table.blocks:
            if not block.has_host_copy:
                if block.host == NO_BLOCK:
                    block.host = self.host.allocate(model, 1)[0]
                plan.swap_out.setdefault(model, []).append(BlockCopy(block.device, block.host))
                self._inflight.land(block, plan.step)
            if block.host_pending:
                ready = max(ready, block.xfer_step)
            self._drop_device(model, block)
        table.on_device = False
        table.ready_step = ready

    def has_landed(self, request: Request) -> bool:
        """Whether a ROTARY request's host copies are all complete (it may swap in)."""
        return not self._inflight.is_pending(self._tables[request.id].ready_step)

    def can_swap_in(self, request: Request) -> bool:
        pool = self._pools[request.model]
        return self.has_landed(request) and pool.can_allocate(self.blk(request))

    def swap_in(self, request: Request) -> None:
        """Device blocks for all the request's tokens; H2D copies for those with KV."""
        if not self.has_landed(request):
            raise RuntimeError(f"request {request.id!r}: its host copies have not landed")
        table = self._tables[request.id]
        model, plan = table.model, self._current()
        copies = plan.swap_in.setdefault(model, [])
        owners = self._owners[model]
        devices = self._pools[model].allocate(self.blk(request))
        for block, device in zip(table.blocks, devices, strict=False):
            block.device = device
            owners[device] = block
            copies.append(BlockCopy(device, block.host))
            self._inflight.fence(block, plan.step)
        table.on_device = True
        self._extend(table, devices[len(table) :])

    def free(self, request: Request) -> None:
        table = self._tables.pop(request.id, None)
        if table is None:
            return
        for block in table.blocks:
            self._drop_block(table.model, block)

    def mark_computed(self, request: Request) -> None:
        """The step stored KV up to ``request.num_computed_tokens``: update block states.

        Written blocks lose their host copy unless SYNCED (those are never written);
        blocks now full become SYNCED, ready for eager rotation.
        """
        table = self._tables[request.id]
        old, new, bt = table.num_computed, request.num_computed_tokens, self.block_tokens
        for block in table.blocks[old // bt : self.num_blocks(new)]:
            if block.synced or block.host_pending:
                raise AssertionError(f"request {request.id!r}: write into {block}")
            block.host_valid = False
        for block in table.blocks[old // bt : new // bt]:
            block.synced = True
        table.num_computed = new

    def rotate(self) -> int:
        """Eager rotation: copy SYNCED blocks of running requests to host ahead of need.

        Runs for models whose device KV usage is at or above the watermark, oldest
        tables first (they are the likeliest preemption victims), up to the budget.
        Returns the number of blocks queued.
        """
        budget = self.rotation.budget_blocks if self.rotation.eager else 0
        hot = {m for m in self._pools if self.usage(m) >= self.rotation.watermark}
        if budget == 0 or not hot:
            return 0
        plan, queued = self._current(), 0
        for table in self._tables.values():
            if not table.on_device or table.model not in hot:
                continue
            blocks, i = table.blocks, table.rotated
            while i < len(blocks) and blocks[i].synced and queued < budget:
                block = blocks[i]
                if not block.has_host_copy:
                    if block.host == NO_BLOCK:
                        if not self.host.can_allocate(table.model, 1):
                            return queued
                        block.host = self.host.allocate(table.model, 1)[0]
                    copy = BlockCopy(block.device, block.host)
                    plan.rotate.setdefault(table.model, []).append(copy)
                    self._inflight.land(block, plan.step)
                    queued += 1
                i += 1
            table.rotated = i
            if queued == budget:
                break
        return queued

    def compact(self, model: str) -> int:
        """Vacate the model's highest chunks; return the pages given back to the arena.

        Empty top chunks go back at once. A top chunk whose live blocks fit in free
        blocks below has them moved (``plan.moves``); its sources are freed when the
        step completes, so a later call releases it. Stops at the first chunk that
        cannot move (a block in flight, or too few free blocks below).
        """
        pool, owners, plan = self._pools[model], self._owners[model], self._current()
        released = 0
        for chunk in reversed(pool.held_chunks):
            live = pool.num_used_in(chunk)
            if live == 0:
                pool.release(chunk)
                released += pool.pages_per_chunk
                continue
            blocks = [owners[b] for b in pool.chunk_blocks(chunk) if b in owners]
            free_below = pool.num_held_free - (pool.blocks_per_chunk - live)
            if len(blocks) != live or free_below < live:
                break
            if any(self._inflight.fenced(b) for b in blocks):
                break
            moves = plan.moves.setdefault(model, [])
            for block, dst in zip(blocks, pool.allocate(live), strict=True):
                src = block.device
                moves.append(BlockMove(src, dst))
                del owners[src]
                owners[dst] = block
                block.device = dst
                self._inflight.fence(block, plan.step)
                self._inflight.defer_device(plan.step, model, src)
            break
        return released

    def check_integrity(self, requests: Iterable[Request]) -> None:
        """Raise AssertionError unless every pool, the host space and every table agree.

        free + used = total per pool and host space; no block owned twice; each
        request's table matches its state (see ``check_table``).
        """
        self.arena.check_integrity()
        by_id = {r.id: r for r in requests}
        for rid in self._tables:
            if rid not in by_id:
                raise AssertionError(f"block table of unknown request {rid!r}")
        for r in by_id.values():
            check_table(r, self._tables.get(r.id), self.block_tokens)
        deferred_devices, deferred_hosts = self._inflight.deferred()
        for model, pool in self._pools.items():
            tables = [t for t in self._tables.values() if t.model == model]
            devices = [b.device for t in tables for b in t.blocks if b.device != NO_BLOCK]
            devices += [d for m, d in deferred_devices if m == model]
            hosts = [b.host for t in tables for b in t.blocks if b.host != NO_BLOCK]
            hosts += [h for m, h in deferred_hosts if m == model]
            if len(set(devices)) != len(devices) or len(set(hosts)) != len(hosts):
                raise AssertionError(f"{model}: a block is owned twice")
            owned = {b.device: b for t in tables for b in t.blocks if b.device != NO_BLOCK}
            if owned.keys() != self._owners[model].keys() or any(
                self._owners[model][d] is not b for d, b in owned.items()
            ):
                raise AssertionError(f"{model}: device owner map disagrees with tables")
            pool.check_integrity(set(devices))
            self.host.check_integrity(model, set(hosts))

    # -- internals -------------------------------------------------------------------------
    def _grow(self, table: BlockTable, n: int) -> None:
        self._extend(table, self._pools[table.model].allocate(n))

    def _extend(self, table: BlockTable, devices: list[int]) -> None:
        owners = self._owners[table.model]
        for device in devices:
            block = Block(device)
            owners[device] = block
            table.blocks.append(block)

    def _drop_device(self, model: str, block: Block) -> None:
        device, block.device = block.device, NO_BLOCK
        del self._owners[model][device]
        if self._inflight.fenced(block):
            self._inflight.defer_device(block.xfer_step, model, device)
        else:
            self._pools[model].free((device,))

    def _drop_block(self, model: str, block: Block) -> None:
        if block.device != NO_BLOCK:
            self._drop_device(model, block)
        if block.host != NO_BLOCK:
            host, block.host = block.host, NO_BLOCK
            block.host_valid = False
            if self._inflight.fenced(block):
                self._inflight.defer_host(block.xfer_step, model, host)
            else:
                self.host.free(model, (host,))
