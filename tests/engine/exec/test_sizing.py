"""Sizing: the host swap space, given or by default, and what does not fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from shunter.engine.errors import ServeError
from shunter.engine.exec.serving import model_specs
from shunter.engine.exec.sizing import (
    BLOCK_TOKENS,
    KVNeed,
    default_host_swap_bytes,
    host_ram_bytes,
    serving_config,
)


def test_host_swap_space_given_or_holding_every_need(tiny_dirs: dict[str, Path]) -> None:
    specs = model_specs({"a": tiny_dirs["tiny-llama"], "b": tiny_dirs["tiny-qwen2"]})
    needs = [KVNeed("x", "a", 100), KVNeed("y", "b", 40)]
    expected = sum(
        -(-n // BLOCK_TOKENS) * spec.block_bytes(BLOCK_TOKENS)
        for spec, n in zip(specs, (100, 40), strict=True)
    )
    assert default_host_swap_bytes(specs, needs) == expected
    assert serving_config(specs, needs).host_swap_bytes == expected
    assert serving_config(specs, needs, host_swap_bytes=1 << 20).host_swap_bytes == 1 << 20


def test_the_default_stays_within_half_the_hosts_memory(tiny_dirs: dict[str, Path]) -> None:
    specs = model_specs({"a": tiny_dirs["tiny-llama"], "b": tiny_dirs["tiny-qwen2"]})
    block = max(spec.block_bytes(BLOCK_TOKENS) for spec in specs)
    huge = [KVNeed("x", "a", host_ram_bytes() // block * BLOCK_TOKENS)]
    assert default_host_swap_bytes(specs, huge) == host_ram_bytes() // 4


def test_a_host_budget_beyond_ram_is_refused(tiny_dirs: dict[str, Path]) -> None:
    specs = model_specs({"a": tiny_dirs["tiny-llama"], "b": tiny_dirs["tiny-qwen2"]})
    needs = [KVNeed("x", "a", 100)]
    too_much = host_ram_bytes() // 2 + 4096
    with pytest.raises(ServeError, match="host-budget"):
        serving_config(specs, needs, host_swap_bytes=too_much)
