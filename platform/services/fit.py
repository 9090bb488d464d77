"""The fit: do a node's enabled deployments fit its HBM?

Every change to what a node serves (a deployment, a model's directory, the node's HBM)
checks it before it is saved (``check_node_fit``); the console shows it per node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.core.exceptions import ValidationError

from shunter.engine.config import ModelSpec, RemapConfig
from shunter.platform.models import Deployment, Node


def remappable_layers(spec: ModelSpec) -> int:
    """Decoder layers of ``spec`` that remapping may take at most: the engine's default
    cap (``RemapConfig.cap_layers``), and never so many that fewer than two stay resident
    (``remap.layers.max_alpha``: a slot and a layer)."""
    return max(0, min(RemapConfig().cap_layers(spec.num_layers), spec.num_layers - 2))


def kv_reserve_bytes(deployment: Deployment) -> int:
    """The KV a deployment keeps at least: its floor, and never less than one full
    context (``max_context`` or the model's), which the engine needs to admit one."""
    context = deployment.context_tokens() * deployment.model.kv_bytes_per_token
    return max(deployment.kv_floor_bytes or 0, context)


@dataclass(frozen=True)
class Fit:
    """The HBM a node's enabled deployments need, by part.

    - spatial models run whenever they have work: all their weights stay resident;
    - temporal models take turns: the largest one's weights resident (whoever holds the
      turn), every other one only its non-remappable share (embeddings, the head and the
      layers beyond the remapping cap), the rest lent to the KV cache while it waits;
    - a KV reserve per deployment (``kv_reserve_bytes``).

    The KV floors must also fit beside every model's weights, all of them resident: the
    engine keeps a floor out of the pages no weights hold, since the layers remapping
    lends come back (``KVMemory.check_floors``; it refuses floors that do not fit).
    """

    hbm_bytes: int
    spatial_weight_bytes: int
    temporal_weight_bytes: int
    kv_reserve_bytes: int
    all_weight_bytes: int
    kv_floor_bytes: int

    @property
    def need_bytes(self) -> int:
        return self.spatial_weight_bytes + self.temporal_weight_bytes + self.kv_reserve_bytes

    @property
    def floors_fit(self) -> bool:
        return self.all_weight_bytes + self.kv_floor_bytes <= self.hbm_bytes

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.hbm_bytes and self.floors_fit

    def describe(self) -> str:
        gib = 1024**3
        text = (
            f"needs {self.need_bytes} bytes ({self.need_bytes / gib:.2f} GiB: spatial weights "
            f"{self.spatial_weight_bytes}, temporal weights {self.temporal_weight_bytes}, "
            f"KV reserve {self.kv_reserve_bytes}) of {self.hbm_bytes} bytes of HBM "
            f"({self.hbm_bytes / gib:.2f} GiB)"
        )
        if not self.floors_fit:
            text += (
                f", and its KV floors ({self.kv_floor_bytes} bytes) must fit beside every "
                f"model's weights resident ({self.all_weight_bytes} bytes)"
            )
        return text


def node_fit(*, hbm_bytes: int, deployments: Sequence[Deployment]) -> Fit:
    """The fit of ``deployments`` (the enabled ones of one node) in ``hbm_bytes``."""
    spatial = [d for d in deployments if d.sharing == Deployment.Sharing.SPATIAL]
    temporal = [d.model.spec() for d in deployments if d.sharing == Deployment.Sharing.TEMPORAL]
    spatial_bytes = sum(d.model.param_bytes for d in spatial)
    temporal_bytes = 0
    if temporal:
        largest = max(temporal, key=lambda s: (s.param_bytes, s.name))
        temporal_bytes = largest.param_bytes + sum(
            s.param_bytes - remappable_layers(s) * s.layer_bytes
            for s in temporal
            if s is not largest
        )
    return Fit(
        hbm_bytes=hbm_bytes,
        spatial_weight_bytes=spatial_bytes,
        temporal_weight_bytes=temporal_bytes,
        kv_reserve_bytes=sum(kv_reserve_bytes(d) for d in deployments),
        all_weight_bytes=sum(d.model.param_bytes for d in deployments),
        kv_floor_bytes=sum(d.kv_floor_bytes or 0 for d in deployments),
    )


def check_node_fit(node: Node, deployments: Sequence[Deployment]) -> Fit:
    """The fit of ``deployments`` on ``node``; ValidationError when they do not fit."""
    fit = node_fit(hbm_bytes=node.hbm_bytes, deployments=deployments)
    if not fit.fits:
        names = ", ".join(f"{d.model.name} ({d.sharing})" for d in deployments)
        raise ValidationError(
            f"The enabled deployments of node {node.name!r} do not fit its HBM: {names} "
            f"{fit.describe()}."
        )
    return fit
