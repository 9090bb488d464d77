"""The engine's published state: the arena's pages by owner, free pages always listed."""

from __future__ import annotations

from pathlib import Path

import torch

from shunter.engine.exec.serving import TorchEngine
from shunter.engine.memory.arena import FREE, PageOwner
from shunter.engine.server.loop import EngineLoop
from shunter.engine.server.metrics import ServerMetrics
from shunter.engine.server.models import ModelArg
from shunter.engine.server.serve import engine_config
from shunter.engine.server.settings import EngineSettings
from shunter.engine.server.state import state_of


def test_pages_by_owner_add_up_and_list_free_pages_even_when_none_is_left(
    model_dirs: dict[str, Path],
) -> None:
    settings = EngineSettings(models=(ModelArg("llama", model_dirs["tiny-llama"]),), kv_tokens=64)
    engine = TorchEngine(
        {"llama": model_dirs["tiny-llama"]}, engine_config(settings), device=torch.device("cpu")
    )
    loop = EngineLoop(engine, ServerMetrics(["llama"]))
    arena = engine.core.memory.arena
    pages = state_of(loop).arena.pages_by_owner
    assert pages["free"] == arena.num_free_pages > 0
    assert sum(pages.values()) == arena.num_pages
    assert pages["weights:llama"] > 0
    # Every page taken (a burst filled the KV cache): free pages are still listed, as 0.
    free = [p for p in range(arena.num_pages) if arena.owner(p) is FREE]
    arena.convert(free, FREE, PageOwner.kv("llama"))
    pages = state_of(loop).arena.pages_by_owner
    assert pages["free"] == 0 and sum(pages.values()) == arena.num_pages
