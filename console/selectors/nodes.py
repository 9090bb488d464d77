"""Nodes as the console shows them: each node's view (its page and live updates), built
from its cached engine state, and the list of nodes without that state."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypedDict

from shunter.console import figures
from shunter.console.memory_map import memory_map
from shunter.engine.api.state import EngineState, ModelState
from shunter.platform.models import Node
from shunter.platform.selectors import node_list

RECENT_STEPS = 64


class NodeView(TypedDict):
    id: int
    name: str
    status: str
    rotation: str  # "in rotation", or why it is cordoned
    last_seen: str | None
    state_at: float | None
    error: str
    has_state: bool
    turn_holder: str | None
    turn_switches: int
    models: list[dict[str, Any]]
    counters: dict[str, int]
    steps: list[list[float]]
    memory_figure: figures.Figure
    requests_figure: figures.Figure
    rates: dict[str, float] | None


def _host_weight_bytes(node: Node) -> dict[str, int]:
    return {d.model.name: d.model.param_bytes for d in node.deployments.all()}


def prefix_hits(info: ModelState) -> str:
    """The share of queried prompt tokens the prefix cache served, and of those the
    share found in host memory ("62% (18% host)"); "-" before any query."""
    if not info.prefix_queries:
        return "-"
    hit = 100 * info.prefix_hits / info.prefix_queries
    if not info.prefix_host_hits:
        return f"{hit:.0f}%"
    return f"{hit:.0f}% ({100 * info.prefix_host_hits / info.prefix_hits:.0f}% host)"


def node_view(node: Node) -> NodeView:
    """What the node page shows, from the node's cached engine state (no query when its
    deployments and their models are prefetched). ``rates`` stays None here: they need
    two states (``deltas.with_rates``)."""
    state = EngineState.parse(node.state)
    names = list(state.models)
    mem = memory_map(state, _host_weight_bytes(node))
    models = []
    requests: dict[str, dict[str, int]] = {}
    for name, info in state.models.items():
        counts = info.requests
        requests[name] = {
            "running": counts.running,
            "waiting": counts.waiting,
            "rotary": counts.rotary,
        }
        models.append(
            {
                "name": name,
                "sharing": info.sharing,
                "priority": info.priority,
                "active": info.active,
                "kv_blocks_used": info.kv_blocks_used,
                "kv_blocks_total": info.kv_blocks_total,
                "remapped_layers": len(info.remapped_layers),
                "weight_bytes_remapped": info.weight_bytes_remapped,
                "host_swap_blocks_used": info.host_swap_blocks_used,
                "prefix_hits": prefix_hits(info),
                **requests[name],
            }
        )
    transfers, total = state.transfers, state.steps.total
    durations = state.steps.recent_duration_s[-RECENT_STEPS:]
    first = total - len(durations) + 1
    steps = [[first + i, round(1000 * d, 4)] for i, d in enumerate(durations)]
    return {
        "id": node.pk,
        "name": node.name,
        "status": node.status,
        "rotation": node.get_cordon_display(),
        "last_seen": node.last_seen.isoformat() if node.last_seen else None,
        "state_at": node.state_at.timestamp() if node.state_at else None,
        "error": node.last_error,
        "has_state": bool(state.models),
        "turn_holder": state.tenancy.turn_holder,
        "turn_switches": state.tenancy.turn_switches,
        "models": models,
        "counters": {
            "rotations": transfers.rotations,
            "bytes_d2h": transfers.bytes_d2h,
            "bytes_h2d": transfers.bytes_h2d,
            "steps": total,
        },
        "steps": steps,
        "memory_figure": figures.memory_figure(mem, names),
        "requests_figure": figures.requests_figure(requests),
        "rates": None,
    }


def node_list_without_state() -> list[Node]:
    """Every node for a list (name, status, rotation, last contact), without its cached
    engine state, which can be large. One query."""
    return list(node_list().defer("state").order_by("name"))


def node_views(node_ids: Iterable[int] | None = None) -> dict[str, NodeView]:
    """The view of every node, or of those in ``node_ids``, by id, in name order. Three
    queries: the nodes, their deployments, and those deployments' models."""
    nodes = node_list().prefetch_related("deployments__model").order_by("name")
    if node_ids is not None:
        nodes = nodes.filter(pk__in=list(node_ids))
    return {str(node.pk): node_view(node) for node in nodes}
