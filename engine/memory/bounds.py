"""Per-model KV floors and ceilings (``TenantSpec.kv_floor`` / ``kv_ceiling``).

A floor is memory kept for one model: the others may not take the part of it the model
does not hold yet, except what its model lends them (``lent``: the scheduler lends the
part of a floor its model cannot use now and recalls it when it can, ``Capacity``). A
ceiling caps what a model holds. Neither moves a page by itself; they only bound what a
block pool may claim from the free pages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shunter.engine.config import TenantSpec


class KvBounds:
    """Floors and ceilings in bytes, from the tenants."""

    def __init__(self, tenants: Iterable[TenantSpec]) -> None:
        tenants = list(tenants)
        self.floors = {t.model: t.kv_floor for t in tenants if t.kv_floor}
        self.ceilings = {t.model: t.kv_ceiling for t in tenants if t.kv_ceiling is not None}

    @property
    def unbounded(self) -> bool:
        return not self.floors and not self.ceilings

    def room(
        self,
        model: str,
        held: Mapping[str, int],
        free: int,
        lent: Mapping[str, int] | None = None,
    ) -> int:
        """Bytes of the ``free`` ones that ``model`` may take now: within its ceiling,
        leaving every other model what it lacks of its floor less what it lends
        (``lent``, bytes per model). ``held`` is each model's KV bytes."""
        lent = lent or {}
        reserved = sum(
            max(0, floor - held.get(m, 0) - lent.get(m, 0))
            for m, floor in self.floors.items()
            if m != model
        )
        room = free - reserved
        ceiling = self.ceilings.get(model)
        if ceiling is not None:
            room = min(room, ceiling - held.get(model, 0))
        return max(0, room)
