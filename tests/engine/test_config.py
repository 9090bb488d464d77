"""EngineConfig and its knobs validate themselves."""

from __future__ import annotations

import pytest

from shunter.engine.config import EngineConfig, RotationConfig, SchedulerConfig
from tests.engine.fakes import TINY


def test_derived_values() -> None:
    config = EngineConfig(models=(TINY,), device_bytes=10 * 2**21 + 5, host_swap_bytes=0)
    assert config.num_pages == 10
    assert config.model_by_name == {"tiny": TINY}
    assert config.block_bytes("tiny") == 16 * TINY.kv_bytes_per_token
    assert config.scheduler.policy == "lvf+" and config.scheduler.xfer_budget_blocks == 2400


@pytest.mark.parametrize(
    "kwargs",
    [
        {"models": ()},
        {"models": (TINY, TINY)},
        {"device_bytes": 100},
        {"host_swap_bytes": -1},
        {"block_tokens": 0},
        {"page_bytes": 0},
    ],
)
def test_invalid_engine_configs(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {"models": (TINY,), "device_bytes": 2**30, "host_swap_bytes": 0}
    with pytest.raises(ValueError):
        EngineConfig(**{**base, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make",
    [
        lambda: SchedulerConfig(policy="sjf"),
        lambda: SchedulerConfig(xfer_budget_blocks=-1),
        lambda: SchedulerConfig(max_batch_tokens=0),
        lambda: SchedulerConfig(max_running=0),
        lambda: RotationConfig(budget_blocks=-1),
        lambda: RotationConfig(watermark=1.5),
    ],
)
def test_invalid_knobs(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]
