"""Forced remapping (``shunter generate --force-remap [N]``): lend layers without pressure.

A controller wrapper, pure logic, the remapping analogue of ``ForcedRotation``: it makes
parameter remapping happen whatever the memory pressure, so that a short run streams
layers through slots on every forward pass, and any difference from an unremapped run
shows in the tokens.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from shunter.engine.config import RemapConfig
from shunter.engine.remap.controller import (
    ModelState,
    Pressure,
    RemapController,
    RemapDecision,
)

EVERY_LAYER = sys.maxsize
"""A forced count that makes every model lend all it can (a bare ``--force-remap``)."""


def forced_layers(num_layers: int, layers: int) -> int:
    """The layers a model of ``num_layers`` lends when ``layers`` are forced: never more
    than ``num_layers - 2``, so that its layout still has a slot and a resident layer
    whatever the timings say. A model of two layers lends none."""
    return max(0, min(layers, num_layers - 2))


class ForcedRemap(RemapController):
    """The decisions of a controller with ``inner``'s knobs, with at least ``layers``
    layers lent by every model (with ``inactive_only``: by every inactive model)
    whatever the pressure and timings.

    A model lends ``forced_layers(num_layers, layers)``. ``layers`` may change between steps;
    lowering it lets the controller restore layers (dynamic reversion).
    """

    def __init__(self, inner: RemapController, layers: int, *, inactive_only: bool = False) -> None:
        if layers < 0:
            raise ValueError("forced remapping needs layers >= 0")
        config = RemapConfig(
            enabled=True, cap_fraction=inner.config.cap_fraction, capacity_order=inner.order
        )
        super().__init__(config, headroom=inner.headroom)
        self.layers = layers
        self.inactive_only = inactive_only

    def forced(self, m: ModelState) -> int:
        """The layers ``m`` must lend now."""
        if self.inactive_only and m.active:
            return 0
        return forced_layers(m.num_layers, self.layers)

    def cap(self, m: ModelState) -> int:
        # So that the inner controller neither trims a forced model nor counts on
        # memory a trim would free.
        return max(super().cap(m), self.forced(m))

    def plan(
        self,
        models: Sequence[ModelState],
        pressure: Pressure,
        run_next: Sequence[str],
        *,
        idle: bool = False,
    ) -> RemapDecision:
        decision = super().plan(models, pressure, run_next, idle=idle)
        targets = dict(decision.targets)
        for m in models:
            target = max(targets.get(m.name, m.alpha), self.forced(m))
            if target == m.alpha:
                targets.pop(m.name, None)
            else:
                targets[m.name] = target
        alpha = {m.name: m.alpha for m in models}
        # Restores before reclaims, as the inner controller orders them.
        order = sorted(targets, key=lambda name: targets[name] >= alpha[name])
        reverting = decision.reverting and all(targets[name] == 0 for name in targets)
        return RemapDecision({name: targets[name] for name in order}, reverting)
