"""Nodes: registered and changed, with their engine's token stored encrypted."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from shunter.platform import selectors
from shunter.platform.models import Node
from shunter.platform.services.changes import roll_out_on_commit
from shunter.platform.services.fit import check_node_fit

NODE_FIELDS = {"name", "engine_url", "hardware_profile", "hbm_bytes", "dram_bytes"}


@transaction.atomic
def node_create(*, engine_token: str = "", **fields: Any) -> Node:
    """Register a node (Node fields: ``name``, ``engine_url``, ``hbm_bytes``, ...) and
    its engine's token, stored encrypted."""
    unknown = set(fields) - NODE_FIELDS
    if unknown:
        raise TypeError(f"node_create() got unexpected fields {sorted(unknown)}")
    node = Node(**fields)
    node.set_engine_token(engine_token)
    node.full_clean()
    node.save()
    return node


@transaction.atomic
def node_update(*, node: Node, engine_token: str | None = None, **fields: Any) -> Node:
    """Change a node; ``engine_token`` None keeps the stored token, '' clears it. Its
    deployments must still fit (a smaller HBM may not), and it is reconciled when its
    engine's address or token changed."""
    unknown = set(fields) - NODE_FIELDS
    if unknown:
        raise TypeError(f"node_update() got unexpected fields {sorted(unknown)}")
    node = Node.objects.select_for_update().get(pk=node.pk)
    reach_changed = engine_token is not None or fields.get("engine_url", node.engine_url) != (
        node.engine_url
    )
    for field, value in fields.items():
        setattr(node, field, value)
    if engine_token is not None:
        node.set_engine_token(engine_token)
    node.full_clean()
    check_node_fit(node, selectors.node_desired_deployments(node=node))
    node.save()
    if reach_changed:
        roll_out_on_commit([node.pk])
    return node
