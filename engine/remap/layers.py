"""Which layers a remapped model streams, and how many it can (Oneiros §5.3, §5.4).

A model of ``n`` layers that hands the memory of ``alpha`` layers to the KV cache runs
all ``n`` layers in the memory of ``n - alpha``. ``m`` layers take turns in ``slots``
shared frames, ``m = alpha + slots``: while the GPU computes the layers between two of
them, the next one is copied host-to-device into a slot. The other ``n - m`` layers stay
resident.

With ``T_T`` the time to copy one layer host-to-device and ``T_c`` the compute time of
one layer:

- one slot (``m = alpha + 1``) needs ``T_T * (alpha + 1) <= T_c * (n - alpha - 1)``:
  a layer's copy cannot start before the slot's previous layer has run (Eq. 4);
- two slots (``m = alpha + 2``, double buffering) need ``T_T * (alpha + 2) <= T_c * n``
  (Eq. 5), which is also §5.3's bound ``T_T * N <= T_compute`` on the layers copied per
  forward pass;
- otherwise ``alpha`` is too large and must be lowered.

The ``m`` layers are evenly spaced around the circular layer order (the last layer of
one token is followed by the first of the next): that maximises the smallest stretch of
compute between two copies (§5.4, Eq. 3). A model is never remapped whole: at least one
layer always stays resident.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """Where a model's layers live: ``streamed`` (ascending) take turns in ``num_slots``
    frames; every other layer is resident; ``alpha`` layers' frames are KV memory."""

    num_layers: int
    alpha: int
    streamed: tuple[int, ...]

    def __post_init__(self) -> None:
        m = len(self.streamed)
        if self.alpha == 0 and m:
            raise ValueError("a layout without remapped layers streams nothing")
        if self.alpha and not 1 <= m - self.alpha <= 2:
            raise ValueError(f"{m} streamed layers for alpha={self.alpha}: need 1 or 2 slots")
        if m >= self.num_layers:
            raise ValueError("at least one layer stays resident")
        if list(self.streamed) != sorted(set(self.streamed)) or (
            self.streamed and not 0 <= self.streamed[0] <= self.streamed[-1] < self.num_layers
        ):
            raise ValueError(f"streamed layers must be distinct layers in order: {self.streamed}")

    @property
    def m(self) -> int:
        return len(self.streamed)

    @property
    def num_slots(self) -> int:
        return self.m - self.alpha

    @property
    def resident(self) -> tuple[int, ...]:
        streamed = set(self.streamed)
        return tuple(i for i in range(self.num_layers) if i not in streamed)


def resident_layout(num_layers: int) -> Layout:
    """Nothing remapped: every layer resident."""
    return Layout(num_layers, 0, ())


def uniform_layers(n: int, m: int, offset: int = 0) -> tuple[int, ...]:
    """``m`` of ``n`` layers at uniform intervals around the circle, starting at
    ``offset``, ascending. Consecutive gaps (the last one wrapping around) differ by at
    most one layer."""
    if not 0 <= m <= n:
        raise ValueError(f"cannot pick {m} of {n} layers")
    return tuple(sorted((offset + (i * n) // m) % n for i in range(m)))


def num_slots(n: int, alpha: int, t_transfer: float, t_layer: float) -> int | None:
    """Slots needed to stream ``alpha`` remapped layers of an ``n``-layer model without
    stalls: 1 (Eq. 4), else 2 (Eq. 5), else None (lower ``alpha``). 0 for ``alpha == 0``.
    Never lets the streamed layers cover the whole model."""
    if alpha == 0:
        return 0
    if alpha + 1 < n and t_transfer * (alpha + 1) <= t_layer * (n - alpha - 1):
        return 1
    if alpha + 2 < n and t_transfer * (alpha + 2) <= t_layer * n:
        return 2
    return None


def max_alpha(n: int, t_transfer: float, t_layer: float, cap: int) -> int:
    """The most layers an ``n``-layer model can remap within ``cap``.

    Both inequalities only get harder as ``alpha`` grows, so the feasible values are
    ``0..max_alpha``.
    """
    best = 0
    for alpha in range(1, min(cap, n - 2) + 1):
        if num_slots(n, alpha, t_transfer, t_layer) is None:
            break
        best = alpha
    return best


def select(
    n: int,
    alpha: int,
    t_transfer: float,
    t_layer: float,
    *,
    keep: tuple[int, ...] = (),
) -> Layout:
    """The layout for ``alpha`` remapped layers: ``m`` uniformly spaced layers, the
    rotation among the ``n`` possible ones that shares the most layers with ``keep``
    (the layers streamed now, which need no reload), lowest offset among equals.

    An ``alpha`` the timings cannot hide (a model kept above its cap while memory is
    short) gets two slots, which stall least; ValueError if not even one layer would
    stay resident.
    """
    slots = num_slots(n, alpha, t_transfer, t_layer)
    if slots is None:
        slots = 2 if alpha + 2 < n else 1
        if alpha + slots >= n:
            raise ValueError(f"alpha={alpha} of {n} layers leaves no layer resident")
    if alpha == 0:
        return resident_layout(n)
    m = alpha + slots
    kept = set(keep)
    best = max(
        range(n),
        key=lambda offset: (len(kept.intersection(uniform_layers(n, m, offset))), -offset),
    )
    return Layout(n, alpha, uniform_layers(n, m, best))
