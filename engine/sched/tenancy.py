"""Tenancy: which models execute in a step, how soon the others will, and their KV bounds.

Each model is a tenant with a sharing mode, a priority and optional KV floor and
ceiling:

- **spatial** models execute in every step in which they have work;
- **temporal** models take turns, one holding the turn. The turn passes when the holder
  has no work, or once it has held the turn for the minimum quantum, to the temporal
  model whose most-lagging request has the largest VLT (the holder keeps it on a tie,
  so a switch is never paid for nothing).

A temporal model without the turn is *inactive*: its layers are remapped first and its
requests' KV rotates out first. Spatial models and the turn holder are *active*.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shunter.engine.config import SloSpec

SHARING_MODES = ("spatial", "temporal")


@dataclass(frozen=True)
class TenantSpec:
    """One model's tenancy: ``sharing`` mode, ``slo`` (the default class of its
    requests), ``priority`` (higher runs first and loses layers last), and KV bounds in
    bytes: ``kv_floor`` is kept for it alone, ``kv_ceiling`` (None: no bound) caps it."""

    model: str
    sharing: str = "spatial"
    slo: SloSpec | None = None
    priority: int = 0
    kv_floor: int = 0
    kv_ceiling: int | None = None

    def __post_init__(self) -> None:
        if self.sharing not in SHARING_MODES:
            raise ValueError(f"tenant {self.model!r}: sharing must be one of {SHARING_MODES}")
        if self.kv_floor < 0 or (self.kv_ceiling is not None and self.kv_ceiling < self.kv_floor):
            raise ValueError(f"tenant {self.model!r}: need 0 <= kv_floor <= kv_ceiling")


class Tenancy:
    """Turns, activity and KV bounds of a set of tenants.

    Call ``executing`` once per step: it passes the turn, records who executes, and
    returns them. ``lag[m]`` is the VLT of model m's most lagging request, or None when m
    has no work.
    """

    def __init__(self, tenants: Sequence[TenantSpec], *, min_quantum_s: float) -> None:
        names = [t.model for t in tenants]
        if len(set(names)) != len(names):
            raise ValueError(f"one tenant per model: {names}")
        if min_quantum_s < 0:
            raise ValueError("min_quantum_s must be >= 0")
        self.tenants = {t.model: t for t in tenants}
        self.min_quantum_s = min_quantum_s
        self.holder: str | None = None
        self.t_turn = 0.0
        self.num_switches = 0
        self.t_last_active = dict.fromkeys(names, -float("inf"))
        self._temporal = [t.model for t in tenants if t.sharing == "temporal"]
        self._spatial = [t.model for t in tenants if t.sharing == "spatial"]

    def is_active(self, model: str) -> bool:
        return self.tenants[model].sharing == "spatial" or model == self.holder

    def executing(self, now: float, lag: Mapping[str, float | None]) -> list[str]:
        """Models that run this step: spatial ones with work, then the turn holder if it
        has work (after passing the turn if it is due)."""
        self._pass_turn(now, lag)
        models = [m for m in self._spatial if lag.get(m) is not None]
        if self.holder is not None and lag.get(self.holder) is not None:
            models.append(self.holder)
        for m in models:
            self.t_last_active[m] = now
        return models

    def _pass_turn(self, now: float, lag: Mapping[str, float | None]) -> None:
        ready = [(lag_m, m) for m in self._temporal if (lag_m := lag.get(m)) is not None]
        if not ready:
            return
        holder = self.holder
        holder_lag = lag.get(holder) if holder is not None else None
        if holder_lag is not None and now - self.t_turn < self.min_quantum_s:
            return
        best_lag, best = max(ready, key=lambda pair: pair[0])
        if holder_lag is not None and holder_lag >= best_lag:
            return
        self.holder, self.t_turn = best, now
        self.num_switches += holder is not None

    def run_next(self, lag: Mapping[str, float | None]) -> list[str]:
        """Every model, the ones most likely to run next first: active ones with work,
        then waiting ones by lag (largest first), then idle ones by priority (highest
        first), the least recently active first among equals (round robin)."""

        def key(m: str) -> tuple[int, float, float]:
            t = self.tenants[m]
            if lag.get(m) is None:
                return (2, -t.priority, self.t_last_active[m])
            return (0 if self.is_active(m) else 1, -(lag[m] or 0.0), 0.0)

        return sorted(self.tenants, key=key)

    def kv_room(self, model: str, held: Mapping[str, int], free: int) -> int:
        """Bytes of free KV memory ``model`` may still take: within its ceiling, and
        leaving every other model what it lacks of its floor. ``held`` is each model's
        KV bytes now, ``free`` the free bytes."""
        reserved = sum(
            max(0, t.kv_floor - held.get(m, 0)) for m, t in self.tenants.items() if m != model
        )
        room = free - reserved
        ceiling = self.tenants[model].kv_ceiling
        if ceiling is not None:
            room = min(room, ceiling - held.get(model, 0))
        return max(0, room)
