"""The paper's multi-tenant scenarios (Oneiros Table 1) and the variants compared on them.

- ``c1``: OPT-13B 35%, Llama-2-13B 35%, Llama-3-8B 20% of GPU memory;
- ``c2``: OPT-30B 65%, OPT-6.7B 15%;

on a GH200 with 96 GB of HBM3, the paper's testbed (§7.1). Each model's share of GPU
memory less the pages its weights take is its KV floor, kept for it alone as the
separate vLLM instances of the paper's setup keep theirs; the arena is the sum of the
shares, and the pages remapping frees go to whichever model needs them.

Sharing modes shape the load as well as the scheduling:

- ``spatial``: every model receives requests all the time;
- ``temporal``: the models take turns, like the agents of a workflow handing over:
  model i receives requests only in the i-th window of each cycle and is idle outside it.

Variants: ``none`` (vLLM-like: FCFS, passive preemption, no remapping), ``oneiros``
(FCFS with remapping), ``rotasched`` (LVF rotation, no remapping), ``combined`` (LVF
and remapping, memory taken in the capacity order).
"""

from __future__ import annotations

from dataclasses import dataclass

from shunter.engine.catalog import get_model
from shunter.engine.config import ModelSpec
from shunter.engine.memory.weights import weight_pages
from shunter.engine.sim.mix import ModelLoad, OnOff
from shunter.engine.workload.lengths import LengthSampler, sharegpt_like

SHARING = ("temporal", "spatial")


@dataclass(frozen=True)
class Variant:
    """A compared configuration: the scheduling ``policy``, whether layers remap, what
    a preempted request's KV becomes (``SchedulerConfig.preemption``) and whether blocks
    rotate to host ahead of preemption (DuplexKV's eager rotation)."""

    name: str
    policy: str
    remap: bool
    preemption: str
    eager_rotation: bool


# Oneiros' baseline is vLLM (v0.7.3, §7.1), which out of KV "pause[s] the decode process
# for all active requests, evict[s] one, and recompute[s] its KV cache" (§7.2); Oneiros
# is built into that vLLM and remaps weights instead of swapping KV (§1, §3.2), so both
# recompute whatever remapping cannot cover. RotaSched swaps and rotates (SuperInfer §4).
VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("none", "fcfs", False, preemption="recompute", eager_rotation=False),
        Variant("oneiros", "fcfs", True, preemption="recompute", eager_rotation=False),
        Variant("rotasched", "lvf", False, preemption="swap", eager_rotation=True),
        Variant("combined", "lvf", True, preemption="swap", eager_rotation=True),
        # The same with lvf+, which rotates only when memory binds and only requests
        # whose TBT slack covers the round trip (sched/lvf.py).
        Variant("rotasched+", "lvf+", False, preemption="swap", eager_rotation=True),
        Variant("combined+", "lvf+", True, preemption="swap", eager_rotation=True),
        # And with lvf+shed, which puts requests past their SLO after the others.
        Variant("rotasched+shed", "lvf+shed", False, preemption="swap", eager_rotation=True),
        Variant("combined+shed", "lvf+shed", True, preemption="swap", eager_rotation=True),
    )
}


@dataclass(frozen=True)
class Scenario:
    """Models with their shares of GPU memory, on ``hardware``."""

    name: str
    shares: tuple[tuple[str, float], ...]
    hardware: str = "gh200-96g"

    @property
    def models(self) -> tuple[ModelSpec, ...]:
        return tuple(get_model(name) for name, _ in self.shares)

    @property
    def memory_fraction(self) -> float:
        """The share of GPU memory the engine's arena takes."""
        return sum(share for _, share in self.shares)

    def kv_floors(self, hbm_bytes: float, page_bytes: int) -> dict[str, int]:
        """Each model's KV floor in bytes: the whole pages of its share of ``hbm_bytes``
        less the pages its weights take (each layer in pages of its own, as the arena
        places them). So the floors add up to no more than the arena's pages less every
        model's weights, which the engine requires (``KVMemory.check_floors``)."""
        floors = {}
        for spec, (name, share) in zip(self.models, self.shares, strict=True):
            pages = int(share * hbm_bytes) // page_bytes - weight_pages(spec, page_bytes)
            floor = pages * page_bytes
            if floor <= 0:
                raise ValueError(f"{self.name}: {name}'s share does not hold its weights")
            floors[name] = floor
        return floors

    def loads(
        self,
        sharing: str,
        rate: float,
        *,
        window_s: float,
        cv: float,
        lengths: LengthSampler = sharegpt_like,
    ) -> list[ModelLoad]:
        """Each model at ``rate`` requests per second while it receives any: always
        (spatial), or in its own ``window_s`` of every cycle (temporal); request lengths
        from ``lengths``."""
        if sharing not in SHARING:
            raise ValueError(f"sharing must be one of {SHARING}")
        n = len(self.shares)
        return [
            ModelLoad(
                name,
                rate,
                cv=cv,
                lengths=lengths,
                schedule=None
                if sharing == "spatial"
                else OnOff(n * window_s, window_s, i * window_s),
            )
            for i, (name, _) in enumerate(self.shares)
        ]


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("c1", (("opt-13b", 0.35), ("llama-2-13b", 0.35), ("llama-3-8b", 0.20))),
        Scenario("c2", (("opt-30b", 0.65), ("opt-6.7b", 0.15))),
    )
}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}: choose one of {sorted(SCENARIOS)}") from None
