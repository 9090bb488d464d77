"""``GET /admin/state``: a snapshot of the engine's real state, taken between steps.

The engine thread publishes an ``EngineSnapshot`` (``EngineLoop.snapshot``) after
steps, after commands and before it waits idle; the HTTP side reads the latest one and
never waits for a step to end. What the HTTP side owns (each model's configured
sharing, priority and limits) is merged in when the route answers (``with_config``).
The body's schema is ``engine.api.state.EngineState``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shunter.engine.api.state import (
    ArenaState,
    EngineState,
    HostSwapState,
    LiveRequests,
    ModelState,
    RequestCounts,
    StepStats,
    TenancyState,
    TransferTotals,
)
from shunter.engine.exec.serving import TorchEngine, remapped_layers
from shunter.engine.memory.arena import OwnerKind, PageOwner
from shunter.engine.memory.kv_memory import KVMemory

if TYPE_CHECKING:
    from shunter.engine.server.loop import EngineLoop
from shunter.engine.server.models import ServedModel


def _remapped_pages(memory: KVMemory, model: str, layers: list[int]) -> int:
    layout, arena = memory.weights[model], memory.arena
    return sum(
        arena.owner(p) != PageOwner.weights(model, i) for i in layers for p in layout.layers[i]
    )


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's state as ``state_of`` gave it at ``t_snapshot`` (the monotonic
    clock). ``state`` never changes after publication: readers on any thread take the
    whole snapshot by one attribute read (the loop swaps it)."""

    state: EngineState
    t_snapshot: float

    @classmethod
    def take(cls, loop: EngineLoop) -> EngineSnapshot:
        """A snapshot of ``loop``'s engine now; on the engine thread, or before it starts."""
        return cls(state_of(loop), time.monotonic())

    def age_s(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.t_snapshot


def engine_state(loop: EngineLoop, models: Mapping[str, ServedModel]) -> dict[str, Any]:
    """``/admin/state``'s body without the route's fields: ``state_of`` with each
    model's configuration (``with_config``). Call it on the engine thread
    (``EngineLoop.call``)."""
    return with_config(state_of(loop), models).to_json()


def with_config(state: EngineState, models: Mapping[str, ServedModel]) -> EngineState:
    """``state`` with each model's sharing, priority, KV bounds, ``max_context`` and
    ``share_prefixes`` as configured (None where unset). A model the server no longer
    lists (a reload under way) keeps them None."""
    per_model = {}
    for name, model in state.models.items():
        served = models.get(name)
        if served is not None:
            arg = served.arg
            model = dataclasses.replace(
                model,
                sharing=arg.sharing,
                priority=arg.priority,
                kv_floor=arg.kv_floor,
                kv_ceiling=arg.kv_ceiling,
                max_context=arg.max_context,
                share_prefixes=arg.share_prefixes,
            )
        per_model[name] = model
    return dataclasses.replace(state, models=per_model)


def state_of(loop: EngineLoop) -> EngineState:
    """Per model: whether it is active (spatial, or holding the turn), KV blocks, weight
    pages resident and remapped layers, requests by state; the temporal turn; the
    arena's pages by owner; host swap use; rotations and bytes moved per direction; recent
    step times and the current per-step token budget. Call it on the engine thread, or
    before the loop starts."""
    engine: TorchEngine = loop.engine
    core = engine.core
    memory, scheduler = core.memory, core.scheduler
    tenancy = scheduler.tenancy
    arena = memory.arena
    owners = arena.counts()
    prefix = memory.prefix_stats
    per_model = {}
    for name, q in scheduler.queues.items():
        remapped = memory.remapped_layers(name)
        weight_pages = sum(
            n for o, n in owners.items() if o.kind is OwnerKind.WEIGHTS and o.model == name
        )
        per_model[name] = ModelState(
            active=tenancy.is_active(name),
            kv_blocks_used=memory.blocks_used()[name],
            kv_blocks_total=memory.num_total_blocks(name),
            kv_usage=memory.usage(name),
            weight_bytes_resident=weight_pages * arena.page_bytes,
            remapped_layers=list(remapped),
            weight_bytes_remapped=_remapped_pages(memory, name, remapped) * arena.page_bytes,
            requests=RequestCounts(
                waiting=len(q.waiting),
                running=len(q.running),
                rotary=len(q.rotary) + len(q.landing),
            ),
            host_swap_blocks_used=memory.host.num_used(name),
            prefix_queries=prefix.queries.get(name, 0),
            prefix_hits=prefix.hits.get(name, 0),
            prefix_host_hits=prefix.host_hits.get(name, 0),
            prefix_cached_blocks=memory.num_cached_blocks(name),
            prefix_host_cached_blocks=memory.host.num_cached(name),
        )
    pages: Counter[str] = Counter({"free": 0})  # listed even when every page is taken
    for owner, n in owners.items():
        pages["free" if owner.kind is OwnerKind.FREE else f"{owner.kind.value}:{owner.model}"] += n
    totals = engine.totals
    steps = list(loop.recent_steps)
    return EngineState(
        models=per_model,
        arena=ArenaState(arena.page_bytes, arena.num_pages, dict(sorted(pages.items()))),
        host_swap=HostSwapState(memory.host.used_bytes, memory.host.capacity_bytes),
        tenancy=TenancyState(
            turn_holder=tenancy.holder,
            temporal=list(tenancy.temporal),
            spatial=list(tenancy.spatial),
            turn_switches=tenancy.num_switches,
        ),
        requests=LiveRequests(live=core.num_live, streams=loop.num_streams),
        transfers=TransferTotals(
            rotations=totals.rotations,
            preemptions=totals.preemptions,
            blocks_d2h=totals.blocks_swapped_out,
            blocks_h2d=totals.blocks_swapped_in,
            bytes_d2h=loop.bytes_moved["d2h"],
            bytes_h2d=loop.bytes_moved["h2d"],
            remapped_layers_now=remapped_layers(memory),
            # Steps whose copies have not completed: blocks freed meanwhile (by an
            # abort) come back when they do.
            steps_in_flight=memory.num_pending_steps,
        ),
        steps=StepStats(
            total=totals.steps,
            recent_duration_s=[s.duration_s for s in steps],
            recent_schedule_s=[s.schedule_s for s in steps],
            token_budget=scheduler.step_tokens,
        ),
    )
