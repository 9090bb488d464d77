"""``GET /admin/state``'s body, typed: what the engine reports of itself and what the
control plane, the console and the gateway read of it.

The engine builds an ``EngineState`` and answers ``to_json()``. Readers parse a body,
or a copy the control plane stored, with ``EngineState.parse``: a snapshot from another
engine version or a damaged row is untrusted, so a missing or mistyped field reads as its
empty value (0, None, an empty list) instead of failing the page or the poll that reads
it. Pure logic: no torch, no aiohttp, no Django.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _is_number(value: Any) -> bool:
    """A JSON number: an int or a float, not a boolean."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _bool_or_none(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _int_or_none(value: Any) -> int | None:
    return int(value) if _is_number(value) else None


def _int(value: Any) -> int:
    return int(value) if _is_number(value) else 0


def _float(value: Any) -> float:
    return float(value) if _is_number(value) else 0.0


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _strs(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _ints(value: Any) -> list[int]:
    return [_int(v) for v in value] if isinstance(value, list) else []


def _floats(value: Any) -> list[float]:
    return [_float(v) for v in value] if isinstance(value, list) else []


@dataclass(frozen=True)
class RequestCounts:
    """A model's requests by state; ``rotary`` counts those whose KV is on the host or
    on its way back."""

    waiting: int = 0
    running: int = 0
    rotary: int = 0

    @classmethod
    def parse(cls, value: Any) -> RequestCounts:
        d = _dict(value)
        return cls(_int(d.get("waiting")), _int(d.get("running")), _int(d.get("rotary")))

    @property
    def total(self) -> int:
        return self.waiting + self.running + self.rotary


@dataclass(frozen=True)
class ModelState:
    """One served model: its configuration as the engine holds it (None where unset or
    unknown), whether it may run now (spatial, or holding the turn), its KV blocks,
    weight bytes resident and lent to KV (``remapped_layers``), requests, host swap and
    the prefix cache."""

    sharing: str | None = None
    priority: int | None = None
    kv_floor: int | None = None
    kv_ceiling: int | None = None
    max_context: int | None = None
    share_prefixes: bool | None = None
    active: bool = False
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    kv_usage: float = 0.0
    weight_bytes_resident: int = 0
    remapped_layers: list[int] = field(default_factory=list)
    weight_bytes_remapped: int = 0
    requests: RequestCounts = field(default_factory=RequestCounts)
    host_swap_blocks_used: int = 0
    # The prefix cache since the engine started: prompt tokens looked up, found (on the
    # device or in host memory) and found in host memory; blocks cached on each tier.
    prefix_queries: int = 0
    prefix_hits: int = 0
    prefix_host_hits: int = 0
    prefix_cached_blocks: int = 0
    prefix_host_cached_blocks: int = 0

    @classmethod
    def parse(cls, value: Any) -> ModelState:
        d = _dict(value)
        return cls(
            sharing=_str_or_none(d.get("sharing")),
            priority=_int_or_none(d.get("priority")),
            kv_floor=_int_or_none(d.get("kv_floor")),
            kv_ceiling=_int_or_none(d.get("kv_ceiling")),
            max_context=_int_or_none(d.get("max_context")),
            share_prefixes=_bool_or_none(d.get("share_prefixes")),
            active=d.get("active") is True,
            kv_blocks_used=_int(d.get("kv_blocks_used")),
            kv_blocks_total=_int(d.get("kv_blocks_total")),
            kv_usage=_float(d.get("kv_usage")),
            weight_bytes_resident=_int(d.get("weight_bytes_resident")),
            remapped_layers=_ints(d.get("remapped_layers")),
            weight_bytes_remapped=_int(d.get("weight_bytes_remapped")),
            requests=RequestCounts.parse(d.get("requests")),
            host_swap_blocks_used=_int(d.get("host_swap_blocks_used")),
            prefix_queries=_int(d.get("prefix_queries")),
            prefix_hits=_int(d.get("prefix_hits")),
            prefix_host_hits=_int(d.get("prefix_host_hits")),
            prefix_cached_blocks=_int(d.get("prefix_cached_blocks")),
            prefix_host_cached_blocks=_int(d.get("prefix_host_cached_blocks")),
        )


@dataclass(frozen=True)
class ArenaState:
    """The page arena: page size, page count, and pages by owner (``free``,
    ``weights:<model>``, ``kv:<model>``)."""

    page_bytes: int = 0
    num_pages: int = 0
    pages_by_owner: dict[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, value: Any) -> ArenaState:
        d = _dict(value)
        owners = {str(k): _int(v) for k, v in _dict(d.get("pages_by_owner")).items()}
        return cls(_int(d.get("page_bytes")), _int(d.get("num_pages")), owners)

    def owner_bytes(self, owner: str) -> int:
        return self.pages_by_owner.get(owner, 0) * self.page_bytes


@dataclass(frozen=True)
class HostSwapState:
    bytes_used: int = 0
    bytes_total: int = 0

    @classmethod
    def parse(cls, value: Any) -> HostSwapState:
        d = _dict(value)
        return cls(_int(d.get("bytes_used")), _int(d.get("bytes_total")))


@dataclass(frozen=True)
class TenancyState:
    """Which temporal model holds the turn (None: none), the models by sharing mode, and
    how often the turn changed hands."""

    turn_holder: str | None = None
    temporal: list[str] = field(default_factory=list)
    spatial: list[str] = field(default_factory=list)
    turn_switches: int = 0

    @classmethod
    def parse(cls, value: Any) -> TenancyState:
        d = _dict(value)
        return cls(
            _str_or_none(d.get("turn_holder")),
            _strs(d.get("temporal")),
            _strs(d.get("spatial")),
            _int(d.get("turn_switches")),
        )


@dataclass(frozen=True)
class LiveRequests:
    live: int = 0
    streams: int = 0

    @classmethod
    def parse(cls, value: Any) -> LiveRequests:
        d = _dict(value)
        return cls(_int(d.get("live")), _int(d.get("streams")))


@dataclass(frozen=True)
class TransferTotals:
    """Totals since the engine started: rotations, preemptions, KV blocks and bytes per
    direction; layers lent to KV now, over all models; steps whose copies are in flight
    (blocks freed meanwhile come back when they complete)."""

    rotations: int = 0
    preemptions: int = 0
    blocks_d2h: int = 0
    blocks_h2d: int = 0
    bytes_d2h: int = 0
    bytes_h2d: int = 0
    remapped_layers_now: int = 0
    steps_in_flight: int = 0

    @classmethod
    def parse(cls, value: Any) -> TransferTotals:
        d = _dict(value)
        return cls(**{name: _int(d.get(name)) for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class StepStats:
    """Steps since the start, the recent ones' durations and scheduling times (seconds,
    oldest first) and the scheduler's current per-step token budget."""

    total: int = 0
    recent_duration_s: list[float] = field(default_factory=list)
    recent_schedule_s: list[float] = field(default_factory=list)
    token_budget: int = 0

    @classmethod
    def parse(cls, value: Any) -> StepStats:
        d = _dict(value)
        return cls(
            _int(d.get("total")),
            _floats(d.get("recent_duration_s")),
            _floats(d.get("recent_schedule_s")),
            _int(d.get("token_budget")),
        )


@dataclass(frozen=True)
class EngineState:
    """One snapshot of an engine, as ``GET /admin/state`` answers it."""

    models: dict[str, ModelState] = field(default_factory=dict)
    arena: ArenaState = field(default_factory=ArenaState)
    host_swap: HostSwapState = field(default_factory=HostSwapState)
    tenancy: TenancyState = field(default_factory=TenancyState)
    requests: LiveRequests = field(default_factory=LiveRequests)
    transfers: TransferTotals = field(default_factory=TransferTotals)
    steps: StepStats = field(default_factory=StepStats)
    # As the route answers: when the snapshot was taken (Unix time) and its age, whether
    # the loop stalled, the engine drains, or a deployment change is under way.
    t_snapshot: float = 0.0
    snapshot_age_s: float = 0.0
    stalled: bool = False
    draining: bool = False
    reconciling: bool = False

    @classmethod
    def parse(cls, value: Any) -> EngineState:
        """The state in a JSON body or a stored copy; an empty one for anything that is
        not a JSON object."""
        d = _dict(value)
        models = {str(k): ModelState.parse(v) for k, v in _dict(d.get("models")).items()}
        return cls(
            models=models,
            arena=ArenaState.parse(d.get("arena")),
            host_swap=HostSwapState.parse(d.get("host_swap")),
            tenancy=TenancyState.parse(d.get("tenancy")),
            requests=LiveRequests.parse(d.get("requests")),
            transfers=TransferTotals.parse(d.get("transfers")),
            steps=StepStats.parse(d.get("steps")),
            t_snapshot=_float(d.get("t_snapshot")),
            snapshot_age_s=_float(d.get("snapshot_age_s")),
            stalled=d.get("stalled") is True,
            draining=d.get("draining") is True,
            reconciling=d.get("reconciling") is True,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
