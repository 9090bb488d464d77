"""The engine configuration a server's settings make: the host swap space."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import pytest

from shunter.engine.errors import ServeError
from shunter.engine.exec.serving import model_specs
from shunter.engine.exec.sizing import BLOCK_TOKENS, weight_bytes
from shunter.engine.server.models import ModelArg
from shunter.engine.server.serve import engine_config
from shunter.engine.server.settings import EngineSettings, settings_from_dict
from tests.engine.server.conftest import ServerThread


def _settings(model_dirs: dict[str, Path]) -> EngineSettings:
    return EngineSettings(
        models=(
            ModelArg("llama", model_dirs["tiny-llama"]),
            ModelArg("qwen", model_dirs["tiny-qwen2"]),
        ),
        kv_tokens=8192,
    )


def test_an_hbm_budget_alone_keeps_the_default_host_swap_space(
    model_dirs: dict[str, Path],
) -> None:
    settings = _settings(model_dirs)
    unbudgeted = engine_config(settings)
    budgeted = engine_config(dataclasses.replace(settings, hbm_budget=unbudgeted.device_bytes))
    # Not one context per model: kv_tokens of each, as without a budget.
    specs = model_specs({m.name: m.path for m in settings.models})
    one_context_each = sum(
        -(-s.max_context // BLOCK_TOKENS) * s.block_bytes(BLOCK_TOKENS) for s in specs
    )
    assert budgeted.host_swap_bytes == unbudgeted.host_swap_bytes > one_context_each


def test_host_budget_sizes_the_host_swap_space(model_dirs: dict[str, Path]) -> None:
    settings = _settings(model_dirs)
    config = engine_config(dataclasses.replace(settings, host_budget=3 << 20))
    assert config.host_swap_bytes == 3 << 20
    budgeted = dataclasses.replace(settings, host_budget=5 << 20, hbm_budget=64 << 20)
    assert engine_config(budgeted).host_swap_bytes == 5 << 20


def test_host_budget_from_the_config() -> None:
    data = {"host_budget": "2G", "models": [{"name": "a", "path": "/a"}]}
    assert settings_from_dict(data, "test").host_budget == 2 << 30


def test_max_context_sizes_the_arena(model_dirs: dict[str, Path]) -> None:
    # Fewer kv_tokens than a context: the arena holds one whole context of each model.
    settings = dataclasses.replace(_settings(model_dirs), kv_tokens=16)
    short = dataclasses.replace(
        settings, models=tuple(dataclasses.replace(m, max_context=64) for m in settings.models)
    )
    full, limited = engine_config(settings), engine_config(short)
    assert limited.device_bytes < full.device_bytes
    # A max_context above the model's own context changes nothing.
    long = dataclasses.replace(
        settings,
        models=tuple(dataclasses.replace(m, max_context=1 << 30) for m in settings.models),
    )
    assert engine_config(long).device_bytes == full.device_bytes


def test_kv_floors_must_fit_the_arena(model_dirs: dict[str, Path]) -> None:
    settings = _settings(model_dirs)
    config = engine_config(settings)
    kv_bytes = config.device_bytes - weight_bytes(config.models, config.page_bytes)
    page = config.page_bytes
    half = kv_bytes // 2 // page * page

    def with_floors(*floors: int) -> EngineSettings:
        models = [
            dataclasses.replace(m, kv_floor=f) for m, f in zip(settings.models, floors, strict=True)
        ]
        return dataclasses.replace(settings, models=tuple(models))

    assert [t.kv_floor for t in engine_config(with_floors(half, half)).tenants] == [half] * 2
    with pytest.raises(ServeError, match=r"floors add up to .* lower the models' kv_floor"):
        engine_config(with_floors(half, kv_bytes - half + page))


def test_a_built_server_keeps_its_startup_objects_out_of_the_collectors_sight(
    server: ServerThread,
) -> None:
    """``build_state`` freezes the heap: a full collection never walks the models,
    modules and tokenizers again (31-46 ms a collection on this project's CPU host)."""
    engine = server.state.loop.engine
    assert gc.get_freeze_count() > 0
    assert all(o is not engine for o in gc.get_objects())


def test_enforce_eager_reaches_the_engine_config(model_dirs: dict[str, Path]) -> None:
    from shunter.project.cli import build_parser

    settings = _settings(model_dirs)
    assert not engine_config(settings).enforce_eager
    assert engine_config(dataclasses.replace(settings, enforce_eager=True)).enforce_eager
    parser = build_parser()
    assert parser.parse_args(["engine", "--enforce-eager"]).enforce_eager is True
    assert parser.parse_args(["engine"]).enforce_eager is None  # the config decides
    generate = ["generate", "--model", "m=/x", "--prompt", "hi", "--max-tokens", "1"]
    assert parser.parse_args([*generate, "--enforce-eager"]).enforce_eager is True
