"""The model a benchmark runs: the directory it was given, or a preset written with
random weights."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config


def model_or_preset(tmp: str, model_dir: Path | None, preset: str) -> Generator[str, None, Path]:
    """``model_dir``, or else ``preset`` written under ``tmp`` with random weights (and a
    report line saying so): ``model_dir = yield from model_or_preset(...)``."""
    if model_dir is not None:
        return model_dir
    yield f"writing {preset} (random weights) to a temporary directory"
    return init_model_dir(Path(tmp) / preset, config=preset_config(preset), seed=0)
