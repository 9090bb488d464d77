"""The remapping controller (Oneiros §5, Algorithm 1): how many layers each model hands
to the KV cache this step.

Every step it weighs the KV the executing models need against the KV free for them:

- **When**: a deficit is covered from the capacity sources in the configured order
  (default: free pages, inactive models' layers, rotation, active models' layers).
  **Dynamic reversion**: the surplus beyond a headroom (hysteresis) restores remapped
  layers, the model most likely to run next first, as many as it pays for; the engine
  keeps stepping while idle until they are back (``EngineCore.is_idle``). Oneiros
  restores only once the surplus covers every reclaimed byte; restoring what the surplus
  covers lets the model about to run take its layers back without waiting for the
  others'.
- **Which model**: inactive models first, lowest priority first, the most recently
  active among equals (its reload is furthest away); active models only once every
  inactive one is at its cap.
- **How many**: up to the cap, the configured share of layers and the most whose
  copies T_T the model's compute hides (``layers.max_alpha``): a decode step for an
  active model or a paused one in mid-decode, a prefill for an inactive one with only
  new requests. Never the whole model. A model above
  its cap (it became active, or its batch shrank) gives the excess back as far as
  memory allows, paid from the same sources as a deficit.

Which layers, and the frames they move between, are ``layers.select`` and
``frames.transition``: the controller only decides counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shunter.engine.config import RemapConfig
from shunter.engine.remap.layers import max_alpha


@dataclass(frozen=True)
class ModelState:
    """What the metadata store knows about one model at a step.

    ``frame_bytes`` is the memory one remapped layer gives the KV cache; ``alpha`` the
    layers remapped now; ``t_last_active`` when it last executed (for MRU order);
    ``t_transfer``, ``t_decode`` and ``t_prefill`` as in ``timing.LayerTiming``.
    """

    name: str
    num_layers: int
    frame_bytes: int
    priority: int
    active: bool
    t_last_active: float
    alpha: int
    t_transfer: float
    t_decode: float
    t_prefill: float

    @property
    def t_compute(self) -> float:
        """The compute that must hide the model's layer copies: a decode step for an
        active model, a prefill for an inactive one, as in Oneiros (§5.3). A paused
        model in mid-decode counts as inactive: its layers sit idle until the turn
        comes back, and when it resumes decoding its cap falls to a decode's and the
        excess goes back as memory allows (``RemapController.plan``)."""
        return self.t_decode if self.active else self.t_prefill


@dataclass(frozen=True)
class Pressure:
    """KV bytes at a step: ``demand`` the executing models need, ``free`` is free for
    them, ``rotation`` what rotating requests out may free (0 without rotation)."""

    demand: int
    free: int
    rotation: int = 0


@dataclass(frozen=True)
class RemapDecision:
    """Remapped layers wanted per model, for the models that change, in the order to
    apply them: restores (most likely to run next first) before reclaims (cheapest
    first). ``reverting`` is set when dynamic reversion restores everything."""

    targets: dict[str, int]
    reverting: bool = False


class RemapController:
    """Decides remapped layer counts from ModelStates and the step's Pressure.

    From ``config``: ``cap_fraction`` bounds each model's remapped share of layers and
    ``capacity_order`` lists the sources of memory. ``headroom`` (bytes) is the
    hysteresis of dynamic reversion.
    """

    def __init__(self, config: RemapConfig, *, headroom: int) -> None:
        if headroom < 0:
            raise ValueError("headroom must be >= 0")
        self.config = config
        self.headroom = headroom
        self.order = config.capacity_order

    def cap(self, m: ModelState) -> int:
        """The most layers ``m`` may have remapped in its current role."""
        share = self.config.cap_layers(m.num_layers)
        return max_alpha(m.num_layers, m.t_transfer, m.t_compute / m.num_layers, share)

    def plan(
        self,
        models: Sequence[ModelState],
        pressure: Pressure,
        run_next: Sequence[str],
        *,
        idle: bool = False,
    ) -> RemapDecision:
        """This step's targets. ``run_next`` ranks models by how soon they will run
        (tenancy's order); it decides whose layers come back first. ``idle``: no request
        is live, so no headroom is kept back from reversion (nothing will claim it
        before the next request, which finds its layers in place instead)."""
        rank = {name: i for i, name in enumerate(run_next)}
        by_next = sorted(models, key=lambda m: (rank.get(m.name, len(rank)), m.name))
        caps = {m.name: self.cap(m) for m in models}
        targets: dict[str, int] = {}
        balance = pressure.free - pressure.demand

        trims = [m for m in by_next if m.alpha > caps[m.name]]
        for m in trims:
            targets[m.name] = caps[m.name]
            balance -= (m.alpha - caps[m.name]) * m.frame_bytes
        if balance < 0:
            balance = self._reclaim(models, caps, set(targets), pressure, balance, targets)
            # Trims memory cannot pay for wait, the model least likely to run next first:
            # it keeps the layers the deficit needs, and gives back the rest.
            for m in reversed(trims):
                if balance >= 0:
                    break
                need = -balance
                keep = min(m.alpha - caps[m.name], -(-need // m.frame_bytes))
                targets[m.name] += keep
                balance += keep * m.frame_bytes
                if targets[m.name] == m.alpha:
                    del targets[m.name]
            return RemapDecision(_restores_first(targets, models))

        targets = self._revert(by_next, targets, balance, 0 if idle else self.headroom)
        left = [targets.get(m.name, m.alpha) for m in models]
        return RemapDecision(targets, reverting=bool(targets) and not any(left))

    def _revert(
        self,
        by_next: Sequence[ModelState],
        targets: dict[str, int],
        balance: int,
        headroom: int,
    ) -> dict[str, int]:
        """Dynamic reversion: with the surplus ``balance`` over ``headroom``, restore
        remapped layers, the model most likely to run next first, as many of its layers
        as the surplus pays for while ``headroom`` stays free; stop at the first model
        it cannot restore fully (the later ones wait for it)."""
        spare = balance - headroom
        for m in by_next:
            alpha = targets.get(m.name, m.alpha)
            if not alpha:
                continue
            k = min(alpha, max(0, spare) // m.frame_bytes)
            if k:
                targets[m.name] = alpha - k
                spare -= k * m.frame_bytes
            if k < alpha:
                break
        return targets

    def _reclaim(
        self,
        models: Sequence[ModelState],
        caps: dict[str, int],
        skip: set[str],
        pressure: Pressure,
        balance: int,
        targets: dict[str, int],
    ) -> int:
        """Cover ``-balance`` bytes from the sources in order; return the new balance."""
        for source in self.order[1:]:
            if balance >= 0:
                break
            if source == "rotation":
                balance += pressure.rotation
                continue
            active = source == "active"
            candidates = [m for m in models if m.active == active and m.name not in skip]
            # Lowest priority first; among equals the most recently active (MRU).
            candidates.sort(key=lambda m: (m.priority, -m.t_last_active, m.name))
            for m in candidates:
                room = caps[m.name] - m.alpha
                if room <= 0:
                    continue
                need = -balance
                k = min(room, -(-need // m.frame_bytes))
                targets[m.name] = m.alpha + k
                balance += k * m.frame_bytes
                if balance >= 0:
                    break
        return balance


def _restores_first(targets: dict[str, int], models: Sequence[ModelState]) -> dict[str, int]:
    alpha = {m.name: m.alpha for m in models}
    restores = {k: v for k, v in targets.items() if v < alpha[k]}
    return restores | {k: v for k, v in targets.items() if v >= alpha[k]}
