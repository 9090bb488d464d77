"""``PUT /admin/deployments``'s body, typed: the models an engine should serve and the
SLO classes they name. The control plane builds it (``DeploymentsBody.to_json``); the
engine reads it with the parser of its settings file, whose ``[[models]]`` and
``[slo_classes]`` tables have these same keys (``MODEL_KEYS``, ``SLO_KEYS``).

``/admin/state`` reports each served model's ``LIMIT_KEYS`` back (null when unset), so the
control plane can tell whether an engine serves what it should. Pure logic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

DEPLOYMENT_KEYS = frozenset({"models", "slo_classes"})
MODEL_KEYS = frozenset(
    {
        "name",
        "path",
        "sharing",
        "priority",
        "slo",
        "kv_floor",
        "kv_ceiling",
        "max_context",
        "share_prefixes",
    }
)
SLO_KEYS = frozenset({"ttft_ms", "tbt_ms", "alpha", "beta_b", "beta_f"})
# A model's limits: KV bytes kept for it alone and at most, the longest context (tokens).
LIMIT_KEYS = ("kv_floor", "kv_ceiling", "max_context")


@dataclass(frozen=True)
class SloEntry:
    """An SLO class as the engine's settings spell it: TTFT and TBT targets (ms) and the
    Virtual Lag Time weights (SuperInfer §4.2.2)."""

    ttft_ms: float
    tbt_ms: float
    alpha: float
    beta_b: float
    beta_f: float

    def to_json(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class ModelEntry:
    """One model to serve: its name, directory (as the engine's host sees it), sharing
    mode, priority, SLO class, the limits that are set (None: unset, left out), and
    whether its tenants share cached prompt prefixes (``share_prefixes``; else each
    tenant's are its own)."""

    name: str
    path: str
    sharing: str = "spatial"
    priority: int = 0
    slo: str | None = None
    kv_floor: int | None = None
    kv_ceiling: int | None = None
    max_context: int | None = None
    share_prefixes: bool = False

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": self.name,
            "path": self.path,
            "sharing": self.sharing,
            "priority": self.priority,
            "slo": self.slo,
            "share_prefixes": self.share_prefixes,
        }
        for key in LIMIT_KEYS:
            if (value := getattr(self, key)) is not None:
                entry[key] = value
        return entry


@dataclass(frozen=True)
class DeploymentsBody:
    models: list[ModelEntry]
    slo_classes: dict[str, SloEntry] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "models": [m.to_json() for m in self.models],
            "slo_classes": {name: slo.to_json() for name, slo in self.slo_classes.items()},
        }
