"""KVMemory: the one object the scheduler and the core use for KV memory.

It composes the arena, one block pool per model, the host swap space, block tables and
the in-flight fences, and offers paired verbs on requests. Like vLLM's KVCacheBlocks,
its answers are counts and ids: callers never touch tables or pools.

Copies and moves are recorded into the current step's StepPlan, between ``begin_step``
and ``end_step``; ``complete`` applies what the transfer engine reports done.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from shunter.engine.config import EngineConfig, ModelSpec
from shunter.engine.memory.arena import FREE, Arena, PageOwner
from shunter.engine.memory.bounds import KvBounds
from shunter.engine.memory.host import HostSwap
from shunter.engine.memory.inflight import InFlight
from shunter.engine.memory.integrity import check_table
from shunter.engine.memory.pool import BlockPool
from shunter.engine.memory.prefix import PrefixStats, block_hashes, chain_start
from shunter.engine.memory.relocation import Relocation
from shunter.engine.memory.table import BlockTable
from shunter.engine.memory.weights import (
    WeightLayout,
    pages_for,
    place_model,
    place_weights,
    weight_pages,
)
from shunter.engine.plan import BlockCopies, StepPlan
from shunter.engine.request import Request, RequestState

RUNNING = RequestState.RUNNING


class NoRoom(ValueError):
    """Models to add do not fit the arena, even with what can be reclaimed; the message
    gives the bytes needed and the bytes free and reclaimable."""


class KVMemory(Relocation):
    """Device and host KV of every model of one engine.

    The arena holds every model's weights; each model's pool claims chunks of the pages
    left as it needs them, within the tenants' KV floors and ceilings (``KvBounds``),
    and ``compact`` gives them back. Remapping turns weight frames (the pages of one
    decoder layer) into free pages and back: ``release_frame``, ``vacate_frame``
    (these moves of capacity are ``Relocation``'s).

    Verbs (each ``can_x`` answers whether ``x`` succeeds now):
      - ``allocate``: a WAITING request gets device blocks for all its tokens; with
        prefix caching the leading ones are the published blocks of its prompt's
        prefix, whose tokens then count as computed.
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
        self.bounds = KvBounds(config.tenants)
        self._lent: dict[str, int] = {}  # bytes of each model's unheld floor others may take
        self._suspended: frozenset[str] = frozenset()  # models whose floor does not hold now
        self._remap = config.remap
        self._kv_bytes = self.arena.num_free_pages * self.arena.page_bytes
        self._kv_bytes += sum(self._lendable_bytes(m) for m in config.models)
        self._pools: dict[str, BlockPool] = {}
        for spec in config.models:
            block_bytes = spec.block_bytes(config.block_tokens)
            self._pools[spec.name] = BlockPool(self.arena, spec.name, block_bytes)
            self.host.register(spec.name, block_bytes)
        self.set_bounds(self.bounds)
        self._block_bytes = {m: pool.block_bytes for m, pool in self._pools.items()}
        self._one_block = dict.fromkeys(self._pools, 1)
        self._vacating: dict[tuple[str, int], list[tuple[BlockPool, int]]] = {}  # draining
        self._tables: dict[str, BlockTable] = {}
        self._unrotated: dict[str, BlockTable] = {}  # SYNCED blocks without a host copy
        self._inflight = InFlight()
        self._plan: StepPlan | None = None
        self._moved_into: dict[str, dict[int, int]] = {}
        self.prefix_caching = config.prefix_caching
        self.prefix_stats = PrefixStats.empty()

    # -- counts for the scheduler --------------------------------------------------------
    def num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    def num_free_blocks(self, model: str) -> int:
        return self._pools[model].num_free

    def num_held_free_blocks(self, model: str) -> int:
        """Free blocks in chunks the model's pool holds (not counting claimable ones)."""
        return self._pools[model].num_held_free

    def set_bounds(self, bounds: KvBounds) -> None:
        """Replace the KV floors and ceilings. They bound claims from now on: a model
        above a new ceiling keeps what it holds and claims nothing more, and a new floor
        is kept from the free pages the model does not hold yet. ValueError, changing
        nothing, when the floors do not fit (``check_floors``)."""
        self.check_floors(bounds)
        self.bounds = bounds
        for pool in self._pools.values():
            pool.claim_limit = None if bounds.unbounded else self._claim_limit(pool)

    def check_floors(self, bounds: KvBounds) -> None:
        """Raise ValueError unless the KV floors of ``bounds`` add up to no more than
        the arena's pages that hold no weights while every layer is in place. A floor
        is memory its model can always have, so together they cannot promise more than
        there is; the pages remapping lends do not count, as it takes them back."""
        if (problem := _floors_problem(bounds.floors, self._kv_page_bytes())) is not None:
            raise ValueError(problem)

    def num_total_blocks(self, model: str, bounds: KvBounds | None = None) -> int:
        """The most blocks the model could ever hold: the KV pages (every page not
        holding weights at start, plus the weights remapping may lend) less the other
        models' floors, within its ceiling (of ``bounds`` instead of the current ones
        when given)."""
        pool, bounds = self._pools[model], self.bounds if bounds is None else bounds
        others = sum(f for m, f in bounds.floors.items() if m != model)
        room = self._kv_bytes - others
        ceiling = bounds.ceilings.get(model)
        if ceiling is not None:
            room = min(room, ceiling)
        return max(0, room) // pool.chunk_bytes * pool.blocks_per_chunk

    def out_of_reach(
        self, model: str, num_tokens: int, bounds: KvBounds | None = None
    ) -> tuple[int, int] | None:
        """``(blocks needed, blocks the model could ever hold)`` when a sequence of
        ``num_tokens`` tokens could never fit ``model``'s KV (``num_total_blocks``, of
        ``bounds`` when given); None when it could. The one rule for "can this request
        ever run": the server's preflight and the scheduler both ask it."""
        need, total = self.num_blocks(num_tokens), self.num_total_blocks(model, bounds)
        return (need, total) if need > total else None

    def held_bytes(self) -> dict[str, int]:
        """Device KV bytes each model's pool holds (used or not)."""
        return {m: pool.num_held * pool.block_bytes for m, pool in self._pools.items()}

    def above_floor(self, model: str) -> bool:
        """Whether the model holds KV beyond its floor: memory other models could use."""
        return self._beyond_floor(model) > 0

    def unheld_floor_bytes(self, model: str) -> int:
        """Bytes of the model's floor it does not hold, lent or not (``kept_floor_bytes``
        is what others may not take of it)."""
        return max(0, -self._beyond_floor(model))

    def unheld_floor_blocks(self, model: str) -> int:
        """``unheld_floor_bytes`` in the blocks its pool could place there: whole chunks
        of them, as a pool claims pages."""
        pool = self._pools[model]
        return self.unheld_floor_bytes(model) // pool.chunk_bytes * pool.blocks_per_chunk

    def num_held_blocks(self, model: str) -> int:
        """Blocks in the chunks the model's pool holds, used or free."""
        return self._pools[model].num_held

    def kept_floor_bytes(self, model: str) -> int:
        """Bytes of the model's unheld floor that no other model may take now: what it
        does not lend."""
        return max(0, self.unheld_floor_bytes(model) - self._lent.get(model, 0))

    def lend_floors(self, lent: Mapping[str, int]) -> None:
        """Let the other models take ``lent[m]`` bytes of model ``m``'s unheld floor
        from now on (none of a model not named). A floor lent and then recalled (lent
        less) is owed back: ``floor_debt``."""
        self._lent = {m: n for m, n in lent.items() if n > 0}

    def suspend_floors(self, models: Iterable[str]) -> None:
        """From now on the floors of ``models`` do not hold, and the others' hold again:
        what such a model holds is beyond its floor, for the other models to take as
        they take memory beyond a floor, and the part of its floor it does not hold is
        not kept for it. A floor that holds again and lacks pages others took is owed
        back (``floor_debt``)."""
        self._suspended = frozenset(models)

    def floor_debt(self) -> int:
        """Bytes the kept floors lack of the free pages: what models holding more than
        their floor took of floors lent and since recalled (or what layers restored
        into their frames took), and must give back."""
        kept = sum(self.kept_floor_bytes(m) for m in self.bounds.floors)
        return max(0, kept - self.free_page_bytes)

    def spare_bytes(self, model: str) -> int:
        """Free KV bytes the model holds beyond its floor: what compaction could give
        another model without moving a used block."""
        pool = self._pools[model]
        return max(0, min(pool.num_held_free * pool.block_bytes, self._beyond_floor(model)))

    def beyond_floor_bytes(self, model: str) -> int:
        """Bytes the model's pool holds beyond its floor (0 when within it)."""
        return max(0, self._beyond_floor(model))

    def _beyond_floor(self, model: str) -> int:
        """Bytes the model's pool holds beyond its floor (negative: short of it)."""
        pool = self._pools[model]
        floor = 0 if model in self._suspended else self.bounds.floors.get(model, 0)
        return pool.num_held * pool.block_bytes - floor

    @property
    def free_page_bytes(self) -> int:
        """Bytes of the arena's free pages."""
        return self.arena.num_free_pages * self.arena.page_bytes

    def block_bytes(self, model: str) -> int:
        return self._pools[model].block_bytes

    def num_incoming_blocks(self, model: str) -> int:
        """Device blocks already released that become free when their copies complete."""
        return self._inflight.num_deferred_devices(model)

    def usage(self, model: str) -> float:
        """Share of the model's device KV capacity in use (1.0 when it has none)."""
        pool = self._pools[model]
        total = pool.num_total
        return 1.0 if total == 0 else 1.0 - pool.num_free / total

    def num_cached_blocks(self, model: str) -> int:
        """Free device blocks of the model that still hold a cached prefix block."""
        return self._pools[model].num_cached

    def _occupancy(self, model: str) -> float:
        """``usage``, counting cached prefix blocks as occupied."""
        pool = self._pools[model]
        total = pool.num_total
        return 1.0 if total == 0 else 1.0 - (pool.num_free - pool.num_cached) / total

    def blocks_used(self) -> dict[str, int]:
        """Device KV blocks in use per model (owned or awaiting a copy)."""
        return {model: pool.num_used for model, pool in self._pools.items()}

    def blk(self, request: Request) -> int:
        """Blocks the request holds on the device (RUNNING) or needs there to run: one
        per block of all its known tokens (otherwise)."""
        if request.state is RUNNING:
            return len(self._tables[request.id].devices)
        return -(-request.num_tokens // self.block_tokens)

    def blks(self, requests: Iterable[Request]) -> list[int]:
        """``blk`` of each request, in one pass: LVF asks for every candidate's each step."""
        return self._sizes(requests, self._one_block)

    def blks_bytes(self, requests: Iterable[Request]) -> list[int]:
        """``blks`` in bytes: each request's blocks times its model's block size."""
        return self._sizes(requests, self._block_bytes)

    def block_ids(self, request_id: str) -> list[int]:
        """Device block ids of a RUNNING request, in token order (for executors)."""
        return self._tables[request_id].devices

    # -- steps ---------------------------------------------------------------------------
    def begin_step(self, plan: StepPlan) -> None:
        self._plan = plan
        self._moved_into = {}

    def end_step(self) -> None:
        self._plan = None

    def complete(self, steps: Iterable[int]) -> None:
        """Steps whose copies completed: land host copies (publishing those of full
        blocks to the prefix cache's host tier), do the deferred frees."""
        for step in steps:
            devices, hosts, landed = self._inflight.complete(step)
            for table, full in landed:
                # Only copies made of full blocks: a preempted request's partial last
                # block has a prompt hash already, but its copy is not that block yet.
                n = min(full, len(table.hashes))
                if n > table.num_host_published:
                    self.host.publish(table.model, table.hosts[:n], table.hashes[:n])
                    table.num_host_published = n
            for model, ids in devices.items():
                self._pools[model].free(ids)
            for model, ids in hosts.items():
                self.host.free(model, ids)
        self._release_drained()

    def _release_drained(self) -> None:
        """Give back every chunk that drained empty: it was draining to be given back
        (``compact``), and one left held once its blocks moved or finished would be
        capacity no model can use, its own included (a request needing it could never
        be placed again). Chunks over a frame being taken back stay: ``vacate_frame``
        turns their pages into weights before anything can claim them."""
        vacating = {(pool.model, c) for chunks in self._vacating.values() for pool, c in chunks}
        for pool in self._pools.values():
            for c in pool.drained_chunks():
                if (pool.model, c) not in vacating:
                    pool.release(c)

    @property
    def num_pending_steps(self) -> int:
        return self._inflight.num_pending_steps

    # -- paired verbs ----------------------------------------------------------------------
    def can_allocate(self, request: Request) -> bool:
        """Whether ``allocate`` succeeds now: blocks for all the request's tokens, less
        those of its cached prefix that running requests hold (shared, they take no
        free block; cached free ones do)."""
        pool, need = self._pools[request.model], self.num_blocks(request.num_tokens)
        if self._caches(request):
            need -= pool.num_in_use(pool.lookup(self._wanted(request)))
        return pool.can_allocate(need)

    def allocate(self, request: Request) -> None:
        """Device blocks for all the request's tokens. With prefix caching, the blocks
        of its prompt's longest published prefix are shared, not allocated, and their
        tokens become computed (``request.num_computed_tokens``); the prompt's last
        token is always computed, for its logits."""
        if request.id in self._tables:
            raise ValueError(f"request {request.id!r} already has a block table")
        pool, need = self._pools[request.model], self.num_blocks(request.num_tokens)
        hits, loads = self._prompt_hits(request, pool)
        table = BlockTable(request.id, request.model, hits + pool.allocate(need - len(hits)))
        table.hashes, table.num_published = list(request.prompt_hashes or ()), len(hits)
        if loads:
            self._load(table, len(hits), loads)
        if hits or loads:
            request.num_computed_tokens = (len(hits) + len(loads)) * self.block_tokens
        table.num_computed = request.num_computed_tokens
        self._tables[request.id] = table

    def _load(self, table: BlockTable, first: int, loads: list[int]) -> None:
        """Copy host-cached blocks ``loads`` into the table's blocks from ``first`` on;
        the request may be computed once they land (``is_resident``), and the host
        blocks stay held until then."""
        plan, model = self._current(), table.model
        _batch(plan.swap_in, model).extend(table.devices[first : first + len(loads)], loads)
        self._inflight.count_swaps(plan.step, model, len(loads))
        self._inflight.defer_host(plan.step, model, loads)
        table.h2d_step = plan.step

    def _prompt_hits(self, request: Request, pool: BlockPool) -> tuple[list[int], list[int]]:
        """The published device blocks of the prompt's longest cached prefix (now shared
        with it) and the published host blocks that continue it (now held, to be copied
        in); nothing without prefix caching or token ids, or for a request that has
        computed tokens already."""
        if not self._caches(request):
            return [], []
        bt, model = self.block_tokens, request.model
        wanted = self._wanted(request)
        hits = pool.lookup(wanted)
        pool.share(hits)
        loads = self.host.lookup(model, wanted[len(hits) :])
        self.host.share(model, loads)
        self.prefix_stats.record(model, request.prompt_tokens, len(hits) * bt, len(loads) * bt)
        return hits, loads

    def _caches(self, request: Request) -> bool:
        """Whether ``allocate`` looks the request's prompt up: prefix caching is on, its
        token ids are known and it has computed nothing."""
        return (
            self.prefix_caching
            and request.prompt_token_ids is not None
            and not request.num_computed_tokens
        )

    def _prompt_hashes(self, request: Request) -> list[bytes]:
        """The chained hashes of the prompt's full blocks (computed once per request)."""
        if request.prompt_hashes is None:
            assert request.prompt_token_ids is not None
            start = chain_start(request.model, request.cache_salt)
            request.prompt_hashes = block_hashes(request.prompt_token_ids, self.block_tokens, start)
        return request.prompt_hashes

    def _wanted(self, request: Request) -> list[bytes]:
        """The prompt's block hashes a lookup may serve: its last token is computed."""
        return self._prompt_hashes(request)[: (request.prompt_tokens - 1) // self.block_tokens]

    def can_append(self, request: Request, num_new_tokens: int) -> bool:
        """Whether blocks for ``num_new_tokens`` more computed tokens are held or free."""
        need = self._num_append_blocks(request, num_new_tokens)
        return need <= 0 or self._pools[request.model].can_allocate(need)

    def append(self, request: Request, num_new_tokens: int) -> None:
        need = self._num_append_blocks(request, num_new_tokens)
        if need > 0:
            self._tables[request.id].devices += self._pools[request.model].allocate(need)

    def num_append_blocks(self, requests: Iterable[Request], num_new_tokens: int) -> list[int]:
        """For each RUNNING request, the blocks beyond those it holds that
        ``num_new_tokens`` more computed tokens need (<= 0: none, ``append`` is a no-op).
        One pass: the scheduler asks for every decode of every step, and only the few
        that start a block need ``can_append`` / ``append``."""
        tables, bt = self._tables, self.block_tokens
        return [
            -(-(r.num_computed_tokens + num_new_tokens) // bt) - len(tables[r.id].devices)
            for r in requests
        ]

    def can_swap_out(self, request: Request) -> bool:
        table = self._tables[request.id]
        need = -(-request.num_computed_tokens // self.block_tokens) - len(table.hosts)
        return need <= 0 or self.host.can_allocate(request.model, need)

    def swap_out(self, request: Request) -> bool:
        """RUNNING -> ROTARY (see the class docstring); returns whether its host copies
        have all landed, so that it may swap in again (``has_landed``)."""
        table = self._tables[request.id]
        plan = self._plan
        if plan is None:
            raise RuntimeError("copies are planned between begin_step and end_step")
        model, devices, hosts = table.model, table.devices, table.hosts
        keep = -(-request.num_computed_tokens // self.block_tokens)
        self._adopt_host_copies(table, request.num_computed_tokens // self.block_tokens)
        valid, copied = table.num_host_valid, table.num_host_copied
        if keep > len(hosts):
            hosts += self.host.allocate(model, keep - len(hosts))
        # Blocks with a valid host copy go now (unless an H2D copy or a move still writes
        # them); landing blocks go when their copies land, newly copied ones when this
        # step's copies complete.
        inflight = self._inflight
        h2d, move = table.h2d_step, table.move_step
        written = inflight.latest_pending(h2d, move)
        self._release_devices(model, devices[:valid] + devices[keep:], written)
        if valid < copied:
            landing = inflight.latest_pending(table.d2h_step, h2d, move)
            self._release_devices(model, devices[valid:copied], landing)
        if copied < keep:
            sources = devices[copied:keep]
            reads = self._copy_sources(model, sources)
            _batch(plan.swap_out, model).extend(reads, hosts[copied:keep])
            full = request.num_computed_tokens // self.block_tokens
            inflight.copy_out(plan.step, table, keep, full, sources)
            table.d2h_step = plan.step
        table.num_host_copied = keep
        table.devices = []
        self._unrotated.pop(table.request_id, None)
        return not inflight.is_pending(table.d2h_step)

    def _adopt_host_copies(self, table: BlockTable, end: int) -> None:
        """With prefix caching, take a hold of the host copies already published (by
        any request) of the table's next blocks up to ``end`` (full ones: a host block
        of a block still written would be copied into again), instead of copying them
        again: a shared block goes to host once for all its holders. Only while every
        host block the table has is a landed copy (``hosts`` is a prefix)."""
        hosts, n = table.hosts, len(table.hosts)
        if not table.hashes or not table.num_host_valid == table.num_host_copied == n:
            return
        found = self.host.lookup(table.model, table.hashes[n : min(end, len(table.hashes))])
        if found:
            self.host.share(table.model, found)
            hosts += found
            table.num_host_valid = table.num_host_copied = table.num_host_published = len(hosts)

    def has_landed(self, request: Request) -> bool:
        """Whether a ROTARY request's host copies are all complete (it may swap in)."""
        return not self._inflight.is_pending(self._tables[request.id].d2h_step)

    def is_resident(self, request: Request) -> bool:
        """Whether a RUNNING request's KV is all on the device: no H2D copy into its
        blocks is still in flight (it may be computed without waiting)."""
        return not self._inflight.is_pending(self._tables[request.id].h2d_step)

    @property
    def num_swap_blocks_in_flight(self) -> int:
        """Blocks of swap-in and preemption copies not complete yet, this step's
        included (eager rotation's copies run on their own budget)."""
        return sum(self._inflight.num_swap_blocks().values())

    @property
    def swap_bytes_in_flight(self) -> int:
        """``num_swap_blocks_in_flight`` in bytes."""
        counts = self._inflight.num_swap_blocks()
        return sum(n * self._pools[m].block_bytes for m, n in counts.items())

    def can_swap_in(self, request: Request) -> bool:
        table = self._tables[request.id]
        if self._inflight.is_pending(table.d2h_step):  # not landed
            return False
        return self._pools[table.model].can_allocate(-(-request.num_tokens // self.block_tokens))

    def swap_in(self, request: Request) -> None:
        """Device blocks for all the request's tokens; H2D copies for those with KV."""
        table = self._tables[request.id]
        if self._inflight.is_pending(table.d2h_step):
            raise RuntimeError(f"request {request.id!r}: its host copies have not landed")
        self._swap_in(table, self._pools[table.model], self.num_blocks(request.num_tokens))

    def try_swap_in(self, request: Request) -> bool:
        """``swap_in`` if ``can_swap_in``; returns whether it did. (One table lookup and
        one fence check: LVF brings many requests back every step.)"""
        table = self._tables[request.id]
        if self._inflight.is_pending(table.d2h_step):  # not landed
            return False
        pool = self._pools[table.model]
        need = -(-request.num_tokens // self.block_tokens)
        if not pool.can_allocate(need):
            return False
        self._swap_in(table, pool, need)
        return True

    def _swap_in(self, table: BlockTable, pool: BlockPool, need: int) -> None:
        """``need`` device blocks for the table and H2D copies of its host blocks; with
        prefix caching its leading blocks still published on the device (another
        holder's, or cached) are shared instead of copied in again."""
        model, plan, hosts = table.model, self._current(), table.hosts
        full = min(len(hosts), table.num_computed // self.block_tokens)
        shared = pool.lookup(table.hashes[:full]) if table.hashes else []
        pool.share(shared)
        devices = shared + pool.allocate(need - len(shared))
        k = len(shared)
        _batch(plan.swap_in, model).extend(devices[k : len(hosts)], hosts[k:])
        self._inflight.count_swaps(plan.step, model, len(hosts) - k)
        table.devices = devices
        table.num_published = k
        table.h2d_step = plan.step

    def free(self, request: Request) -> None:
        table = self._tables.pop(request.id, None)
        if table is None:
            return
        self._unrotated.pop(request.id, None)
        fence = self._fence(table.d2h_step, table.h2d_step, table.move_step)
        if fence is None:
            self._pools[table.model].free(table.devices)
            self.host.free(table.model, table.hosts)
        else:
            self._inflight.defer_device(fence, table.model, table.devices)
            self._inflight.defer_host(fence, table.model, table.hosts)

    def mark_computed(self, request: Request) -> None:
        """The step stored KV up to ``request.num_computed_tokens``: update block states.

        A written block loses its host copy (SYNCED blocks are never written); blocks
        that became SYNCED wait for eager rotation.
        """
        table = self._tables[request.id]
        first = table.num_computed // self.block_tokens
        if table.num_host_copied > first:
            if table.num_host_valid < min(table.num_host_copied, first):
                raise AssertionError(f"request {request.id!r}: write into a landing block")
            table.num_host_copied = first
            table.num_host_valid = min(table.num_host_valid, first)
        table.num_computed = request.num_computed_tokens
        full = table.num_computed // self.block_tokens
        if full > table.num_host_copied:
            self._unrotated[request.id] = table
        if self.prefix_caching and full > table.num_published:
            self._publish(request, table, full)

    def publish_scheduled(self, request: Request, num_new_tokens: int) -> None:
        """This step computes ``num_new_tokens`` more of a RUNNING request's tokens:
        offer the blocks they fill to the prefix cache now, so that a request admitted
        later in the same step shares them. A forward pass writes every sequence's KV of
        a layer before any reads it, so the sharer reads them in the same pass."""
        if not self.prefix_caching:
            return
        table = self._tables[request.id]
        full = (request.num_computed_tokens + num_new_tokens) // self.block_tokens
        if full > table.num_published:
            self._publish(request, table, full)

    def _publish(self, request: Request, table: BlockTable, full: int) -> None:
        """Offer the table's blocks up to ``full`` (now full) to the prefix cache."""
        hashes, bt = table.hashes, self.block_tokens
        if request.prompt_token_ids is None:
            return
        # Output blocks need the tokens sampled into them (a driver that samples no ids
        # publishes its prompts only).
        full = min(full, (request.prompt_tokens + len(request.output_token_ids)) // bt)
        if full <= table.num_published:
            return
        if len(hashes) < full:
            parent = hashes[-1] if hashes else chain_start(request.model, request.cache_salt)
            known = len(hashes)
            tokens = request.token_ids(known * bt, full * bt)
            hashes += block_hashes(tokens, bt, parent)
        pool = self._pools[table.model]
        for i in range(table.num_published, full):
            pool.publish(table.devices[i], hashes[i])
        table.num_published = full

    def rotate(self) -> int:
        """Eager rotation: copy SYNCED blocks of running requests to host ahead of need.

        Runs for models whose device KV is at or above the watermark full, cached
        prefix blocks counted (a full cache is what evicts them, and the host copies
        made here become the prefix cache's host tier when their requests end), tables
        in the order their blocks became SYNCED, up to the budget. Returns the number
        of blocks queued.
        """
        budget = self.rotation.budget_blocks if self.rotation.eager else 0
        hot = {m for m in self._pools if self._occupancy(m) >= self.rotation.watermark}
        if budget == 0 or not hot or not self._unrotated:
            return 0
        plan, queued, bt = self._current(), 0, self.block_tokens
        for rid, table in list(self._unrotated.items()):
            model = table.model
            if model not in hot:
                continue
            self._adopt_host_copies(table, table.num_computed // bt)
            start = table.num_host_copied
            end = min(table.num_computed // bt, start + budget - queued)
            if end > len(table.hosts):
                if not self.host.can_allocate(model, end - len(table.hosts)):
                    break
                table.hosts += self.host.allocate(model, end - len(table.hosts))
            reads = self._copy_sources(model, table.devices[start:end])
            _batch(plan.rotate, model).extend(reads, table.hosts[start:end])
            self._inflight.land(table, end, plan.step)
            table.d2h_step = plan.step
            table.num_host_copied = end
            queued += end - start
            if end == table.num_computed // bt:
                del self._unrotated[rid]
            if queued == budget:
                break
        return queued

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
            devices = [d for t in tables for d in t.devices] + deferred_devices.get(model, [])
            hosts = [h for t in tables for h in t.hosts] + deferred_hosts.get(model, [])
            for h, n in Counter(hosts).items():
                if n != self.host.num_holders(model, h):
                    raise AssertionError(f"{model}: host block {h} has {n} holders")
            for d, n in Counter(devices).items():
                if n != pool.num_holders(d):
                    raise AssertionError(f"{model}: block {d} has {n} holders, counted otherwise")
            pool.check_integrity(set(devices))
            self.host.check_integrity(model, set(hosts))

    # -- models added and removed while serving ------------------------------------------
    def check_room(
        self,
        adding: Sequence[tuple[ModelSpec, int]],
        removing: Collection[str] = (),
        requests: Iterable[Request] = (),
        floors_added: Mapping[str, int] | None = None,
    ) -> None:
        """Raise NoRoom, changing nothing, unless removing the models ``removing`` and
        then adding each ``(spec, tokens)`` of ``adding`` fits: every added model's
        weights in free runs of the arena (free pages, every page of a removed model,
        and the chunks the other models hold without a used block), room for ``tokens``
        KV tokens of each added model, and room for each of ``requests`` (live requests
        of the models that stay) at full length, all within the KV floors: those of the
        models that stay and ``floors_added`` (the added models'), which together must
        fit the pages the weights leave (``check_floors``)."""
        arena = self.arena
        scratch = arena.copy()
        reclaimed: dict[PageOwner, list[int]] = {}
        for model, pool in self._pools.items():
            chunks = pool.held_chunks if model in removing else pool.empty_chunks()
            reclaimed.setdefault(pool.owner, []).extend(
                p for c in chunks for p in pool.chunk_pages(c)
            )
        for model in removing:
            for run, owner in _weight_runs(self.weights[model]):
                reclaimed.setdefault(owner, []).extend(p for p in run if arena.owner(p) == owner)
        for owner, pages in reclaimed.items():
            scratch.convert(pages, owner, FREE)
        page = arena.page_bytes
        free, usable = arena.num_free_pages * page, scratch.num_free_pages * page
        kv_bytes = self._kv_bytes
        for model in removing:
            kv_bytes += self.weights[model].num_pages * page
            kv_bytes -= self._lendable_bytes_of(model)
        for spec, _ in adding:
            need = weight_pages(spec, page) * page
            try:
                place_model(scratch, spec)
            except ValueError as e:
                raise NoRoom(
                    f"model {spec.name!r} needs {need} bytes of arena pages for its weights; "
                    f"the {arena.total_bytes}-byte arena has {free} bytes free and "
                    f"{usable - free} more reclaimable ({e})"
                ) from None
            kv_bytes += self._lendable_bytes(spec) - need
        floors = {m: f for m, f in self.bounds.floors.items() if m not in removing}
        floors.update((m, f) for m, f in (floors_added or {}).items() if f)
        kv_page_bytes = self._kv_page_bytes() + page * (
            sum(self.weights[m].num_pages for m in removing)
            - sum(weight_pages(spec, page) for spec, _ in adding)
        )
        if (problem := _floors_problem(floors, kv_page_bytes)) is not None:
            raise NoRoom(problem)
        for spec, tokens in adding:
            chunk = math.lcm(spec.block_bytes(self.block_tokens), page)
            need = self.num_blocks(tokens) * spec.block_bytes(self.block_tokens)
            others = sum(f for m, f in floors.items() if m != spec.name)
            room = max(0, kv_bytes - others) // chunk * chunk
            if need > room:
                raise NoRoom(
                    f"model {spec.name!r} needs {need} bytes of KV for {tokens} tokens; "
                    f"with its weights placed the KV cache would have {room} bytes for it"
                )
        for r in requests:
            pool = self._pools[r.model]
            need = self.num_blocks(r.max_num_tokens) * pool.block_bytes
            others = sum(f for m, f in floors.items() if m != r.model)
            room = max(0, kv_bytes - others) // pool.chunk_bytes * pool.chunk_bytes
            if need > room:
                raise NoRoom(
                    f"request {r.id!r} of model {r.model!r} needs {need} bytes of KV; the "
                    f"KV cache would leave its model {room} bytes"
                )

    def add_model(self, spec: ModelSpec) -> WeightLayout:
        """Place one more model's weights into free runs of the arena (giving every
        chunk the pools hold without a used block back first, when the free runs do not
        hold them) and give it a block pool and host swap blocks. Raises ValueError,
        changing nothing but those chunks, when it does not fit (``check_room`` first)."""
        if spec.name in self._pools:
            raise ValueError(f"model {spec.name!r} is served already")
        block_bytes = spec.block_bytes(self.block_tokens)
        pool = BlockPool(self.arena, spec.name, block_bytes)  # checks the chunk fits
        page = self.arena.page_bytes
        kv_page_bytes = self._kv_page_bytes() - weight_pages(spec, page) * page
        if (problem := _floors_problem(self.bounds.floors, kv_page_bytes)) is not None:
            raise ValueError(problem)
        try:
            layout = place_model(self.arena, spec)
        except ValueError:
            for other in self._pools.values():
                other.release_empty()
            layout = place_model(self.arena, spec)
        self.weights[spec.name] = layout
        self._pools[spec.name] = pool
        self.host.register(spec.name, block_bytes)
        self._block_bytes[spec.name] = block_bytes
        self._one_block[spec.name] = 1
        self._kv_bytes += self._lendable_bytes(spec) - layout.num_pages * self.arena.page_bytes
        self.set_bounds(self.bounds)
        return layout

    def can_remove_model(self, model: str) -> bool:
        """Whether no request holds blocks of the model and no copy or move of its
        blocks is in flight (so ``remove_model`` may run)."""
        if any(t.model == model for t in self._tables.values()):
            return False
        devices, hosts = self._inflight.deferred()
        return not devices.get(model) and not hosts.get(model)

    def remove_model(self, model: str) -> None:
        """Give every page of a model (its weights and KV chunks) back to the free pages
        and forget it. Its requests must be gone and their copies complete
        (``can_remove_model``, else ValueError, changing nothing)."""
        if not self.can_remove_model(model):
            raise ValueError(f"model {model!r} still has blocks in use or in flight")
        for m, frame in [k for k in self._vacating if k[0] == model]:
            self.cancel_vacate(m, frame)
        pool, layout = self._pools[model], self.weights[model]
        lendable = self._lendable_bytes_of(model)
        pool.release_empty()
        if pool.held_chunks:
            raise AssertionError(f"model {model!r}: chunks {pool.held_chunks} still used")
        for run, owner in _weight_runs(layout):
            self.arena.convert([p for p in run if self.arena.owner(p) == owner], owner, FREE)
        self._kv_bytes += layout.num_pages * self.arena.page_bytes - lendable
        self.host.unregister(model)
        del self._pools[model], self.weights[model]
        del self._block_bytes[model], self._one_block[model]
        self._moved_into.pop(model, None)
        self._lent.pop(model, None)  # a model added again under its name lends nothing yet

    def remapped_layers(self, model: str) -> list[int]:
        """The decoder layers of ``model`` with a page that does not hold their weights
        (lent to the KV cache, or a slot streaming another layer)."""
        arena = self.arena
        return [
            i
            for i, pages in enumerate(self.weights[model].layers)
            if any(arena.owner(p) != PageOwner.weights(model, i) for p in pages)
        ]

    # -- internals -------------------------------------------------------------------------
    def _kv_page_bytes(self) -> int:
        """Bytes of the arena's pages that hold no weights while every layer is in place."""
        placed = sum(w.num_pages for w in self.weights.values())
        return (self.arena.num_pages - placed) * self.arena.page_bytes

    def _lendable_bytes(self, spec: ModelSpec) -> int:
        """Weight bytes of a model that remapping may lend to the KV cache (its frames up
        to the cap)."""
        frame_bytes = pages_for(spec.layer_bytes, self.arena.page_bytes) * self.arena.page_bytes
        return self._lendable(spec.num_layers, frame_bytes)

    def _lendable_bytes_of(self, model: str) -> int:
        """``_lendable_bytes`` of a placed model, from its layout."""
        return self._lendable(len(self.weights[model].layers), self.frame_bytes(model))

    def _lendable(self, num_layers: int, frame_bytes: int) -> int:
        if not self._remap.enabled:
            return 0
        return self._remap.cap_layers(num_layers) * frame_bytes

    def _claim_limit(self, pool: BlockPool) -> Callable[[], int]:
        def limit() -> int:
            lent = self._lent
            if self._suspended:  # a floor that does not hold is lent whole
                lent = {**lent, **{m: self.bounds.floors.get(m, 0) for m in self._suspended}}
            room = self.bounds.room(pool.model, self.held_bytes(), self.free_page_bytes, lent)
            return room // pool.chunk_bytes

        return limit

    def _sizes(self, requests: Iterable[Request], unit: dict[str, int]) -> list[int]:
        """``blk`` of each request times ``unit[model]``, in one pass (``num_tokens``
        inlined: a property call per request would be most of the cost)."""
        tables, bt = self._tables, self.block_tokens
        return [
            (
                len(tables[r.id].devices)
                if r.state is RUNNING
                else -(-(r.prompt_tokens + r.num_output_tokens + r.num_output_placeholders) // bt)
            )
            * unit[r.model]
            for r in requests
        ]

    def _num_append_blocks(self, request: Request, num_new_tokens: int) -> int:
        """Blocks beyond those held that ``num_new_tokens`` more computed tokens need."""
        num_tokens = request.num_computed_tokens + num_new_tokens
        return -(-num_tokens // self.block_tokens) - len(self._tables[request.id].devices)

    def _release_devices(self, model: str, ids: list[int], fence: int | None) -> None:
        """Free ``ids`` now, or when step ``fence``'s copies complete."""
        if not ids:
            return
        if fence is None:
            self._pools[model].free(ids)
        else:
            self._inflight.defer_device(fence, model, ids)


def floors_problem(config: EngineConfig) -> str | None:
    """Why the tenants' KV floors of ``config`` cannot all be kept (``check_floors``), or
    None when they can: what ``KVMemory(config)`` would raise for them."""
    floors = {t.model: t.kv_floor for t in config.tenants}
    placed = sum(weight_pages(m, config.page_bytes) for m in config.models)
    return _floors_problem(floors, (config.num_pages - placed) * config.page_bytes)


def _floors_problem(floors: Mapping[str, int], kv_bytes: int) -> str | None:
    """What is wrong with ``floors`` where ``kv_bytes`` of pages hold no weights: None
    when they add up to no more than that."""
    total = sum(floors.values())
    if total <= kv_bytes:
        return None
    return (
        f"the KV floors add up to {total} bytes but with every model's weights in place "
        f"the arena has {kv_bytes} bytes of KV pages"
    )


def _weight_runs(layout: WeightLayout) -> list[tuple[range, PageOwner]]:
    """Each run of a model's weight pages with the owner it was placed for."""
    runs = [(run, PageOwner.weights(layout.model, i)) for i, run in enumerate(layout.layers)]
    return [*runs, (layout.other, PageOwner.weights(layout.model, None))]


def _batch(copies: dict[str, BlockCopies], model: str) -> BlockCopies:
    """The model's batch in ``copies``, created empty on first use."""
    batch = copies.get(model)
    if batch is None:
        batch = copies[model] = BlockCopies()
    return batch
