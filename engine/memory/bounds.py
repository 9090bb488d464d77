"""Per-model KV floors and ceilings (``TenantSpec.kv_floor`` / ``kv_ceiling``).

A floor is memory kept for one model: the others may not take the part of it the model
does not hold yet. A ceiling caps what a model holds. Neither moves a page by itself;
they only bound what a block pool may claim from the free pages.

The free pages can be fewer than the parts of the floors their models do not hold: a
model that grew beyond its floor into the pages of lent layers holds part of the others'
floors once those layers are loaded back, and floors taken as shares of HBM less the
weights can add up to more than the pages the placed weights leave. Then each model
below its floor may take the share of the free pages that its unheld part is of all the
unheld parts, and a model beyond its floor gives back as models short of memory run
(``Capacity.reclaim``). Keeping every free page for the others' floors instead left a
model with work and an unheld floor nothing to claim while an idle model's floor kept
them all, and the pages reclaim gave back went to that idle floor too (SIMULATED, c1
temporal at 4 req/s, seed 2, with remapping: Llama-3-8B's 14 requests of a burst waited
5.2 s against its 5 s TTFT target, its turns passed on unused, while 4.7-10 GB of pages
were free). Letting each take all it lacks, whichever asks first, left the other short
of its floor instead: in c2 temporal, whose floors lack 0.17 GB more than is free from
the start, rotasched+ switched turns 76 times instead of 10 and its throughput fell
from 178 to 159 tokens/s (SIMULATED, 16 req/s, 30 s, 10 s windows, seed 1).
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
        """Bytes of the ``free`` ones that ``model`` may take now, within its ceiling:
        what leaves every other model what it lacks of its floor, or, where the floors
        lack more than is free, at least the share of ``free`` that the model's own lack
        is of theirs all. ``held`` is each model's KV bytes."""
        reserved = sum(
            max(0, floor - held.get(m, 0)) for m, floor in self.floors.items() if m != model
        )
        lacks = max(0, self.floors.get(model, 0) - held.get(model, 0))
        room = free - reserved
        if lacks and room < lacks:  # the floors lack more than is free: shares of it
            room = max(room, free * lacks // (reserved + lacks))
        ceiling = self.ceilings.get(model)
        if ceiling is not None:
            room = min(room, ceiling - held.get(model, 0))
        return max(0, room)
