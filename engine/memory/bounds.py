"""Per-model KV floors and ceilings (``TenantSpec.kv_floor`` / ``kv_ceiling``).

A floor is memory kept for one model: the others may not take the part of it the model
does not hold yet. A ceiling caps what a model holds. Neither moves a page by itself;
they only bound what a block pool may claim from the free pages.

The free pages can be fewer than the floors' unheld parts: a model that grew beyond its
floor into pages that remapping lent holds part of the others' floors once those layers
are loaded back. Then each model below its floor may take free pages up to what it lacks
of it, whichever asks first, and the model beyond its floor gives the rest back when a
model short of memory runs (``Capacity.reclaim``). Keeping every free page for the
others' floors instead left a model with work and an unheld floor nothing to claim
while an idle model's floor kept them all, and the pages that reclaim gave back went to
that idle floor too (SIMULATED, c1 temporal at 4 req/s, seed 2, with remapping:
Llama-3-8B's 14 requests of a burst waited 5.2 s against its 5 s TTFT target, its turns
passed on unused, while 4.7-10 GB of pages were free).
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

    def room(self, model: str, held: Mapping[str, int], free: int) -> int:
        """Bytes of the ``free`` ones that ``model`` may take now: within its ceiling,
        what it lacks of its own floor, and beyond that what leaves every other model
        what it lacks of its floor. ``held`` is each model's KV bytes."""
        reserved = sum(
            max(0, floor - held.get(m, 0)) for m, floor in self.floors.items() if m != model
        )
        lacks = max(0, self.floors.get(model, 0) - held.get(model, 0))
        room = max(free - reserved, min(free, lacks))
        ceiling = self.ceilings.get(model)
        if ceiling is not None:
            room = min(room, ceiling - held.get(model, 0))
        return max(0, room)
