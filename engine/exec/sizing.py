"""How big the arena is for a set of requests, and how it is paged.

Without a budget the arena holds every request at full length; with one, the budget
is checked against the weights and the largest request before anything loads.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import NamedTuple

from shunter.engine.config import EngineConfig, ModelSpec, RemapConfig, RotationConfig
from shunter.engine.errors import ServeError
from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.memory.weights import pages_for

BLOCK_TOKENS = 16
MAX_PAGE_BYTES = 2 * 1024 * 1024
MIN_PAGE_BYTES = 4096
# Forced rotation copies every SYNCED block to host at once (eager rotation from an
# empty arena, with a budget no step reaches).
FORCED_ROTATION = RotationConfig(eager=True, budget_blocks=1 << 20, watermark=0.0)


def page_bytes_for(specs: Sequence[ModelSpec], block_tokens: int) -> int:
    """Arena pages of 2 MiB, or less for models whose KV blocks are smaller: the largest
    block rounded up to a power of two, so a small budget still splits into many pages."""
    largest = max(spec.block_bytes(block_tokens) for spec in specs)
    return max(MIN_PAGE_BYTES, min(MAX_PAGE_BYTES, 1 << (largest - 1).bit_length()))


def weight_bytes(specs: Sequence[ModelSpec], page_bytes: int) -> int:
    """Arena bytes the weights take (each layer in whole pages, as KVMemory places them)."""
    pages = sum(
        pages_for(m.layer_bytes, page_bytes) * m.num_layers
        + pages_for(m.embedding_params * m.dtype_bytes, page_bytes)
        for m in specs
    )
    return pages * page_bytes


class KVNeed(NamedTuple):
    """A request's KV at full length: ``num_tokens`` of ``model``; ``where`` names it."""

    where: str
    model: str
    num_tokens: int


def host_ram_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def default_host_swap_bytes(specs: Sequence[ModelSpec], needs: Sequence[KVNeed]) -> int:
    """Host swap space that holds every need's KV, within half the machine's memory over
    all models (each model has a swap tensor of this size)."""
    by_name = {spec.name: spec for spec in specs}
    kv_bytes = sum(
        -(-need.num_tokens // BLOCK_TOKENS) * by_name[need.model].block_bytes(BLOCK_TOKENS)
        for need in needs
    )
    return min(kv_bytes, host_ram_bytes() // (2 * len(specs)))


def check_host_budget(host_budget: int, num_models: int) -> None:
    """ServeError when a swap tensor of ``host_budget`` bytes per model exceeds RAM."""
    ram = host_ram_bytes()
    if host_budget * num_models > ram:
        raise ServeError(
            f"--host-budget {host_budget} is too large: each of the {num_models} models "
            f"keeps a host swap tensor of that size, {host_budget * num_models} bytes in "
            f"all, and the host has {ram} bytes of memory"
        )


def serving_config(
    specs: tuple[ModelSpec, ...],
    needs: Sequence[KVNeed],
    *,
    hbm_budget: int | None = None,
    host_swap_bytes: int | None = None,
    force_rotation: bool = False,
    remap: bool = False,
    check_integrity: bool = False,
    prefix_caching: bool = False,
    async_scheduling: bool = False,
    enforce_eager: bool = False,
) -> EngineConfig:
    """The engine configuration for serving ``needs`` concurrently.

    Without ``hbm_budget`` the arena holds every request at full length (each model's
    equal share of the KV pages holds all of its requests); with it, the arena is that
    many bytes, and ServeError says when the weights or a single request do not fit.
    Host swap space is ``host_swap_bytes`` (ServeError when the models' swap tensors
    would exceed RAM), by default ``default_host_swap_bytes`` of ``needs``.

    With ``remap`` the engine lends weight layers to the KV cache (Oneiros), but
    every request must still fit without them: how many layers a model can lend depends
    on its timings, and a request that only fits in lent memory could wait forever.
    """
    page_bytes = page_bytes_for(specs, BLOCK_TOKENS)
    by_name = {spec.name: spec for spec in specs}
    blocks = [-(-need.num_tokens // BLOCK_TOKENS) for need in needs]
    if host_swap_bytes is None:
        host_bytes = default_host_swap_bytes(specs, needs)
    else:
        check_host_budget(host_swap_bytes, len(specs))
        host_bytes = host_swap_bytes

    def config(device_bytes: int) -> EngineConfig:
        return EngineConfig(
            models=specs,
            device_bytes=device_bytes,
            host_swap_bytes=host_bytes,
            page_bytes=page_bytes,
            block_tokens=BLOCK_TOKENS,
            rotation=FORCED_ROTATION if force_rotation else RotationConfig(),
            check_integrity=check_integrity,
            prefix_caching=prefix_caching,
            async_scheduling=async_scheduling,
            enforce_eager=enforce_eager,
        )

    def with_remap(c: EngineConfig) -> EngineConfig:
        return dataclasses.replace(c, remap=RemapConfig(enabled=True)) if remap else c

    if hbm_budget is None:
        per_model = dict.fromkeys(by_name, 0)
        for need, n in zip(needs, blocks, strict=True):
            per_model[need.model] += n
        share = max(
            -(-n * by_name[m].block_bytes(BLOCK_TOKENS) // page_bytes) for m, n in per_model.items()
        )
        device_bytes = weight_bytes(specs, page_bytes) + len(specs) * share * page_bytes
        # Chunks of different models align differently: grow until the pools agree.
        while True:
            memory = KVMemory(config(device_bytes))
            if all(memory.num_total_blocks(m) >= n for m, n in per_model.items()):
                return with_remap(config(device_bytes))
            device_bytes += len(specs) * page_bytes

    try:
        memory = KVMemory(config(hbm_budget))
    except ValueError as e:
        raise ServeError(
            f"--hbm-budget {hbm_budget} is too small for the weights "
            f"({weight_bytes(specs, page_bytes)} bytes in {page_bytes}-byte pages): {e}"
        ) from None
    for need, n in zip(needs, blocks, strict=True):
        if n > memory.num_total_blocks(need.model):
            raise ServeError(
                f"--hbm-budget {hbm_budget} is too small to hold request {need.where}: it "
                f"needs {n} KV blocks of model {need.model!r}, and the model's share of the "
                f"arena after the weights holds {memory.num_total_blocks(need.model)}"
            )
    return with_remap(config(hbm_budget))
