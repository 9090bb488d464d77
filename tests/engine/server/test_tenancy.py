"""Sharing modes reach the scheduler: temporal models take turns, spatial ones run always."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from shunter.engine.server.models import ModelArg
from shunter.engine.server.serve import build_state, engine_config
from shunter.engine.server.settings import EngineSettings, SettingsError, settings_from_dict
from tests.engine.server.conftest import ServerThread, assert_no_leaks, request


@pytest.fixture
def two_temporal(model_dirs: dict[str, Path]) -> Iterator[ServerThread]:
    settings = EngineSettings(
        models=(
            ModelArg("llama", model_dirs["tiny-llama"], "temporal", priority=1),
            ModelArg("qwen", model_dirs["tiny-qwen2"], "temporal"),
        ),
        kv_tokens=4096,
        grace_s=0.5,
    )
    server = ServerThread(build_state(settings, torch.device("cpu"), check_integrity=True))
    yield server
    server.close()


def test_the_engine_config_carries_each_models_tenancy(model_dirs: dict[str, Path]) -> None:
    settings = settings_from_dict(
        {
            "slo_classes": {"gold": {"ttft_ms": 300, "tbt_ms": 40}},
            "models": [
                {
                    "name": "llama",
                    "path": str(model_dirs["tiny-llama"]),
                    "sharing": "temporal",
                    "priority": 2,
                    "slo": "gold",
                    "kv_floor": "1M",
                    "kv_ceiling": "4M",
                },
                {"name": "qwen", "path": str(model_dirs["tiny-qwen2"])},
            ],
        },
        "test",
    )
    tenants = engine_config(settings).tenant_by_model
    llama, qwen = tenants["llama"], tenants["qwen"]
    assert (llama.sharing, llama.priority, llama.kv_floor, llama.kv_ceiling) == (
        "temporal",
        2,
        1 << 20,
        4 << 20,
    )
    assert llama.slo is not None and llama.slo.name == "gold" and llama.slo.tbt_s == 0.04
    assert (qwen.sharing, qwen.priority, qwen.kv_floor, qwen.kv_ceiling) == ("spatial", 0, 0, None)


def test_temporal_models_take_turns_and_both_finish(two_temporal: ServerThread) -> None:
    idle = request("GET", two_temporal.url + "/admin/state").json()
    assert idle["tenancy"]["temporal"] == ["llama", "qwen"]
    assert idle["tenancy"]["spatial"] == []

    def complete(model: str) -> int:
        body = {"model": model, "prompt": "hello there", "max_tokens": 24, "ignore_eos": True}
        r = request("POST", two_temporal.url + "/v1/completions", body=json.dumps(body).encode())
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["completion_tokens"])

    with ThreadPoolExecutor(8) as pool:
        tokens = list(pool.map(complete, ["llama", "qwen"] * 4))
    assert tokens == [24] * 8
    state = assert_idle(two_temporal)
    # Both models ran, so the turn passed at least once; one model holds it now, and
    # only the holder counts as active.
    assert state["tenancy"]["turn_switches"] >= 1
    holder = state["tenancy"]["turn_holder"]
    assert holder in {"llama", "qwen"}
    assert {m: s["active"] for m, s in state["models"].items()} == {
        "llama": holder == "llama",
        "qwen": holder == "qwen",
    }


def assert_idle(server: ServerThread) -> dict[str, Any]:
    state = server.wait_idle()
    assert_no_leaks(state)
    return state


def test_bad_kv_bounds_are_refused(model_dirs: dict[str, Path]) -> None:
    model = {"name": "llama", "path": str(model_dirs["tiny-llama"])}
    with pytest.raises(SettingsError, match="kv_floor"):
        settings_from_dict({"models": [{**model, "kv_floor": "lots"}]}, "test")
    with pytest.raises(SettingsError, match="kv_floor <= kv_ceiling"):
        settings_from_dict({"models": [{**model, "kv_floor": 4096, "kv_ceiling": 1024}]}, "test")


def test_remap_and_capacity_order_reach_the_engine_config(model_dirs: dict[str, Path]) -> None:
    model = {"name": "llama", "path": str(model_dirs["tiny-llama"])}
    settings = settings_from_dict(
        {"remap": True, "capacity_order": ["free", "rotation", "inactive"], "models": [model]},
        "test",
    )
    remap = engine_config(settings).remap
    assert remap.enabled and remap.capacity_order == ("free", "rotation", "inactive")
    assert not engine_config(settings_from_dict({"models": [model]}, "test")).remap.enabled
    with pytest.raises(SettingsError, match="must start with 'free'"):
        settings_from_dict({"capacity_order": ["rotation"], "models": [model]}, "test")
    with pytest.raises(SettingsError, match="remap must be true or false"):
        settings_from_dict({"remap": "yes", "models": [model]}, "test")


def test_a_remapping_server_serves_temporal_models(model_dirs: dict[str, Path]) -> None:
    settings = EngineSettings(
        models=(
            ModelArg("llama", model_dirs["tiny-llama"], "temporal"),
            ModelArg("qwen", model_dirs["tiny-qwen2"], "spatial"),
        ),
        kv_tokens=2048,
        remap=True,
        grace_s=0.5,
    )
    server = ServerThread(build_state(settings, torch.device("cpu"), check_integrity=True))
    try:
        for model in ("llama", "qwen", "llama"):
            body = {"model": model, "prompt": "hi", "max_tokens": 8, "ignore_eos": True}
            r = request("POST", server.url + "/v1/completions", body=json.dumps(body).encode())
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 8
        assert_idle(server)
    finally:
        server.close()
