"""TorchEngine: EngineCore wired to real models, for offline generation and tests.

It builds the pieces in dependency order: the models' host weights (decoder layers
packed, one region per layer, for remapping), the device arena and the host swap space,
the transfers (two CUDA copy streams on a GPU, blocking copies on CPU) and the executor,
the core (whose KVMemory places the weights; with remapping on, given each model's
measured layer copy time), then the weights copied into their pages.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from shunter.engine.config import EngineConfig, ModelSpec, SloSpec
from shunter.engine.core import EngineCore, StepStats
from shunter.engine.exec.arena import DeviceArena
from shunter.engine.exec.detok import token_bytes
from shunter.engine.exec.forced_remap import ForcedRemap
from shunter.engine.exec.forced_rotation import ForcedRotation
from shunter.engine.exec.hf_config import (
    ArchConfig,
    eos_token_ids,
    model_spec_from_config,
    read_config,
)
from shunter.engine.exec.loader import TORCH_DTYPES, load_host_weights
from shunter.engine.exec.model import Transformer, kv_block_shape
from shunter.engine.exec.packing import PackedLayers, pack_layers
from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.slots import WeightFrames, measure_timing
from shunter.engine.exec.torch_executor import ServedModel, TorchExecutor
from shunter.engine.exec.transfers import host_swap_space, make_transfers
from shunter.engine.interfaces import MonotonicClock
from shunter.engine.memory.arena import PageOwner
from shunter.engine.memory.manager import KVMemory
from shunter.engine.request import Request

# The papers' default SLOs (5 s TTFT, 100 ms TBT).
DEFAULT_SLO = SloSpec("default", ttft_s=5.0, tbt_s=0.1)
DTYPE_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}


@dataclass
class Output:
    """A finished request: its tokens, its text and why it ended (``"stop"`` or
    ``"length"``)."""

    request_id: str
    model: str
    prompt_ids: list[int]
    output_ids: list[int]
    text: str
    finish_reason: str
    num_preemptions: int


@dataclass
class Totals:
    """Counts over every step run so far.

    ``rotations`` counts requests that came back from host memory (a preemption that
    kept the KV, then a swap-in); ``blocks_swapped_out`` every D2H block (preemption
    copies and eager rotation), ``blocks_rotated`` the eager ones alone.
    ``remapped_layers_max`` is the most decoder layers, over all models, whose pages
    held no weights at the end of a step (parameter remapping gave them to the KV
    cache), read from the arena's page owners. ``layers_streamed`` counts layer copies
    into slots during forward passes, ``layers_restored`` layers loaded back into
    frames.
    """

    steps: int = 0
    preemptions: int = 0
    rotations: int = 0
    blocks_swapped_out: int = 0
    blocks_swapped_in: int = 0
    blocks_rotated: int = 0
    remapped_layers_max: int = 0
    layers_streamed: int = 0
    layers_restored: int = 0

    def add(self, stats: StepStats) -> None:
        self.steps += 1
        self.preemptions += stats.num_preempted
        self.rotations += stats.num_swapped_in
        self.blocks_swapped_out += stats.d2h_blocks
        self.blocks_swapped_in += stats.h2d_blocks
        self.blocks_rotated += stats.rotated_blocks


def remapped_layers(memory: KVMemory) -> int:
    """Decoder layers, over all models, with a page that does not hold their weights."""
    arena = memory.arena
    return sum(
        any(arena.owner(p) != PageOwner.weights(model, i) for p in pages)
        for model, layout in memory.weights.items()
        for i, pages in enumerate(layout.layers)
    )


class NoProgressError(RuntimeError):
    """The engine has live requests but its steps stopped doing anything."""


def model_specs(
    models: Mapping[str, Path], dtype: torch.dtype | None = None
) -> tuple[ModelSpec, ...]:
    """The ModelSpec of each model directory, sized for serving in ``dtype``
    (default: each checkpoint's own)."""
    name = None if dtype is None else DTYPE_NAMES[dtype]
    return tuple(
        model_spec_from_config(read_config(path), model, dtype=name)
        for model, path in models.items()
    )


class TorchEngine:
    """Serves the model directories ``models`` (by name) with ``config`` on ``device``.

    ``config.models`` must equal ``model_specs(models, dtype)``. ``add_request`` queues
    a prompt; ``step`` runs one engine step and returns the requests it finished;
    ``run`` steps until no request is left. ``totals`` counts preemptions and blocks
    moved, so callers can see rotation happen. With ``force_rotation`` the scheduler's
    policy is wrapped in :class:`ForcedRotation`: requests rotate out after every step
    they run. With ``force_remap`` (remapping on in ``config``) the remapping
    controller is wrapped in :class:`ForcedRemap`: every model (``force_remap_inactive``:
    every inactive one) lends that many layers whatever the pressure.
    """

    def __init__(
        self,
        models: Mapping[str, Path],
        config: EngineConfig,
        *,
        device: torch.device,
        dtype: torch.dtype | None = None,
        force_rotation: bool = False,
        force_remap: int | None = None,
        force_remap_inactive: bool = False,
    ) -> None:
        if config.models != model_specs(models, dtype):
            raise ValueError("config.models must be model_specs(models, dtype)")
        if force_remap is not None and not config.remap.enabled:
            raise ValueError("force_remap needs config.remap.enabled")
        self.arena = DeviceArena(config.num_pages, config.page_bytes, device)
        hosts, device_kv, host_kv = {}, {}, {}
        self.packed: dict[str, PackedLayers] = {}
        pin = device.type == "cuda"
        for name, path in models.items():
            arch = ArchConfig.from_hf(read_config(path))
            model_dtype = dtype or TORCH_DTYPES[arch.dtype]
            # Only the decoder layers are ever copied again: they alone are pinned.
            host = load_host_weights(path, arch, dtype=model_dtype, pin=False)
            self.packed[name] = pack_layers(host, pin=pin)
            hosts[name] = (arch, host)
            shape = kv_block_shape(arch, config.block_tokens)
            device_kv[name] = self.arena.kv_cache(shape, model_dtype)
            host_kv[name] = host_swap_space(config.host_swap_bytes, shape, model_dtype, pin=pin)
        self.transfers = make_transfers(device_kv, host_kv)
        self.executor = TorchExecutor(self.transfers)
        timings = None
        if config.remap.enabled:
            timings = {name: measure_timing(p, device) for name, p in self.packed.items()}
        self.core = EngineCore(
            config, self.executor, self.transfers, MonotonicClock(), timings=timings
        )
        if force_rotation:
            # The policy is the scheduler's one seam for who runs; wrapping it leaves
            # every other part of the step loop as it is.
            self.core.scheduler.policy = ForcedRotation(self.core.scheduler.policy)
        if force_remap is not None:
            remapper = self.core.remapper
            assert remapper is not None  # config.remap.enabled
            remapper.controller = ForcedRemap(
                remapper.controller, force_remap, inactive_only=force_remap_inactive
            )
        for name, path in models.items():
            arch, host = hosts[name]
            layout = self.core.memory.weights[name]
            packed = self.packed[name]
            weights = self.arena.place_weights(host, packed, layout)
            tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
            served = ServedModel(
                model=Transformer(arch, weights),
                kv_cache=device_kv[name],
                block_tokens=config.block_tokens,
                eos_token_ids=eos_token_ids(path),
                token_bytes=token_bytes(tokenizer),
                frames=WeightFrames(packed, self.arena.frames(layout, packed)),
            )
            self.executor.add_model(name, served)
        self.executor.bind(self.core.scheduler.requests, self.core.memory.block_ids)
        self.host_weights = {name: host for name, (_, host) in hosts.items()}
        self.totals = Totals()
        self._ids = itertools.count()
        self._arena_version = -1
        self._remapped = 0

    def add_request(
        self,
        model: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        slo: SloSpec = DEFAULT_SLO,
        t_arr: float | None = None,
    ) -> str:
        """Queue a request that arrived at ``t_arr`` on the core's clock (default now);
        returns its id."""
        request = Request(
            id=f"req-{next(self._ids)}",
            model=model,
            prompt_tokens=len(prompt_ids),
            max_output_tokens=params.max_tokens,
            slo=slo,
            t_arr=self.core.clock.now() if t_arr is None else t_arr,
            prompt_token_ids=list(prompt_ids),
        )
        self.core.add_request(request)
        self.executor.add_request(request.id, model, params)
        return request.id

    def step(self) -> list[Output]:
        return self._outputs(self._step())

    def step_with_stats(self) -> tuple[StepStats, list[Output]]:
        """``step``, with the core's figures for the step (for servers and metrics)."""
        stats = self._step()
        return stats, self._outputs(stats)

    def _step(self) -> StepStats:
        stats = self.core.step()
        self.totals.add(stats)
        memory = self.core.memory
        if memory.arena.version != self._arena_version:
            self._arena_version = memory.arena.version
            self._remapped = remapped_layers(memory)
        self.totals.remapped_layers_max = max(self.totals.remapped_layers_max, self._remapped)
        self.totals.layers_streamed = self.executor.num_layers_streamed
        self.totals.layers_restored = self.executor.num_layers_restored
        return stats

    def _outputs(self, stats: StepStats) -> list[Output]:
        outputs = []
        for request in stats.finished:
            text, reason = self.executor.output(request.id)
            outputs.append(
                Output(
                    request_id=request.id,
                    model=request.model,
                    prompt_ids=list(request.prompt_token_ids or ()),
                    output_ids=list(request.output_token_ids),
                    text=text,
                    finish_reason=reason or "length",
                    num_preemptions=request.num_preemptions,
                )
            )
        return outputs

    def run(self, *, max_idle_steps: int = 1000) -> dict[str, Output]:
        """Step until idle; every request finished meanwhile, by id.

        A step that computes nothing while copies are in flight waits for them rather
        than spinning. Raises NoProgressError after ``max_idle_steps`` steps in a row
        that did nothing at all (no tokens, no copies) with requests still live.
        """
        done: dict[str, Output] = {}
        idle = 0
        while not self.core.is_idle():
            stats = self._step()
            done.update((o.request_id, o) for o in self._outputs(stats))
            if stats.num_batch_tokens or stats.d2h_blocks or stats.h2d_blocks or stats.finished:
                idle = 0
            elif self.core.memory.num_pending_steps:
                self.transfers.synchronize()
            else:
                idle += 1
                if idle >= max_idle_steps:
                    raise NoProgressError(self._stall_report(idle))
        return done

    def _stall_report(self, steps: int) -> str:
        scheduler, memory = self.core.scheduler, self.core.memory
        per_model = ", ".join(
            f"{model}: {len(q.waiting)} waiting, {len(q.running)} running, "
            f"{len(q.rotary) + len(q.landing)} rotary, "
            f"{memory.num_free_blocks(model)}/{memory.num_total_blocks(model)} blocks free"
            for model, q in scheduler.queues.items()
        )
        return f"no progress in {steps} steps with requests left ({per_model})"
