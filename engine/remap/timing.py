"""T_T and T_compute per model: what bounds how many layers can be remapped (§5.3).

T_T, the time to copy one layer host-to-device, depends on the layer's size and the
link, and on what else crosses the link meanwhile: KV swap-ins share it, so a layer
copies more slowly while rotation is busy. T_compute changes with the batch: for an
active model it is the time of a decode step, for an inactive one the time of a prefill
(what it runs first when it becomes active). All start from a prior (T_T profiled alone
on the link) and follow the copies and forward passes the executor reports, as
exponentially weighted averages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class LayerTiming:
    """One model's timings in seconds: ``t_transfer`` copies one layer host-to-device,
    ``t_decode`` is a decode step's forward pass, ``t_prefill`` a prefill step's."""

    t_transfer: float
    t_decode: float
    t_prefill: float

    def __post_init__(self) -> None:
        if min(self.t_transfer, self.t_decode, self.t_prefill) <= 0:
            raise ValueError(f"timings must be positive: {self}")


class MeasuredTimings:
    """Measured layer copy and forward times per model, starting at ``priors``.

    ``observe(model, seconds, prefill)`` folds one forward pass in with weight
    ``weight``: passes with prefill tokens update the prefill estimate, the others the
    decode estimate. ``seconds`` must be compute only, without waits for weights: a
    stall must not make room for more remapping. ``observe_copy(model, seconds)`` folds
    in the mean time a layer's copy took in a step, the same way.
    """

    def __init__(self, priors: dict[str, LayerTiming], weight: float = 0.2) -> None:
        if not 0 < weight <= 1:
            raise ValueError("weight must be in (0, 1]")
        self.weight = weight
        self._t: dict[str, LayerTiming] = dict(priors)

    def __getitem__(self, model: str) -> LayerTiming:
        return self._t[model]

    def add(self, model: str, prior: LayerTiming) -> None:
        """Start measuring one more model at ``prior``."""
        self._t[model] = prior

    def forget(self, model: str) -> None:
        del self._t[model]

    def observe(self, model: str, seconds: float, *, prefill: bool) -> None:
        self._fold(model, "t_prefill" if prefill else "t_decode", seconds)

    def observe_copy(self, model: str, seconds: float) -> None:
        self._fold(model, "t_transfer", seconds)

    def _fold(self, model: str, name: str, seconds: float) -> None:
        """Move ``model``'s estimate ``name`` toward ``seconds`` by the weight."""
        if seconds <= 0:
            return
        t, w = self._t[model], self.weight
        folded = (1 - w) * getattr(t, name) + w * seconds
        self._t[model] = dataclasses.replace(t, **{name: folded})
