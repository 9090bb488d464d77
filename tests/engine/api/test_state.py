"""``/admin/state``'s typed body: a round trip, and untrusted input read as empty values."""

from __future__ import annotations

from typing import Any

from shunter.engine.api.state import EngineState, ModelState, RequestCounts
from tests.console.states import engine_like_state


def test_a_body_round_trips() -> None:
    body = engine_like_state()
    state = EngineState.parse(body)
    assert EngineState.parse(state.to_json()) == state
    assert set(state.to_json()) >= set(body)


def test_missing_and_mistyped_fields_read_as_empty_values() -> None:
    body: dict[str, Any] = {
        "models": {
            "m": {"kv_blocks_used": "7", "requests": {"waiting": 2, "running": None}},
            "n": [],
        },
        "arena": {"page_bytes": 4096, "pages_by_owner": {"free": 3, "kv:m": "x"}},
        "tenancy": {"turn_holder": 5, "temporal": ["m", 1]},
        "stalled": "yes",
    }
    state = EngineState.parse(body)
    assert state.models["m"].kv_blocks_used == 0
    assert state.models["m"].requests == RequestCounts(waiting=2)
    assert state.models["n"] == ModelState()
    assert state.arena.pages_by_owner == {"free": 3, "kv:m": 0}
    assert state.arena.owner_bytes("free") == 3 * 4096
    assert state.tenancy.turn_holder is None and state.tenancy.temporal == ["m"]
    assert not state.stalled
    assert EngineState.parse(None) == EngineState.parse([1, 2]) == EngineState()
