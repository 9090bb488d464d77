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

from shunter.engine.config import DEFAULT_SLO, EngineConfig, ModelSpec, SloSpec, TenantSpec
from shunter.engine.core import EngineCore, NewModel, StepStats
from shunter.engine.exec.arena import DeviceArena
from shunter.engine.exec.detok import token_bytes
from shunter.engine.exec.forced_remap import ForcedRemap
from shunter.engine.exec.forced_rotation import ForcedRotation
from shunter.engine.exec.graphs import StaticDecode, capture_or_eager, graphs_apply
from shunter.engine.exec.hf_config import (
    ArchConfig,
    eos_token_ids,
    model_spec_from_config,
    read_config,
)
from shunter.engine.exec.loader import TORCH_DTYPES, ModelWeights, load_host_weights
from shunter.engine.exec.model import Transformer, kv_block_shape
from shunter.engine.exec.packing import PackedLayers, pack_layers
from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.slots import WeightFrames, measure_timing
from shunter.engine.exec.torch_executor import ServedModel, TorchExecutor
from shunter.engine.exec.transfers import host_swap_space, make_transfers
from shunter.engine.interfaces import MonotonicClock
from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.remap.timing import LayerTiming
from shunter.engine.request import Request
from shunter.kernels.ops import uses_triton

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
    stop_reason: str | int | None = None


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
    return sum(len(memory.remapped_layers(model)) for model in memory.weights)


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


@dataclass
class PreparedModel:
    """A model read from its directory, not placed yet: host weights (decoder layers
    packed, and pinned on a GPU), its host swap space, what ends its requests and, with
    remapping on, its measured layer timing."""

    name: str
    spec: ModelSpec
    arch: ArchConfig
    dtype: torch.dtype
    host: ModelWeights
    packed: PackedLayers
    kv_shape: tuple[int, ...]
    host_kv: torch.Tensor
    eos_token_ids: tuple[int, ...]
    token_bytes: list[bytes]
    timing: LayerTiming | None
    tokenizer_json: str = ""  # for constrained output


def prepare_model(
    name: str,
    path: Path,
    config: EngineConfig,
    device: torch.device,
    dtype: torch.dtype | None,
    *,
    timing: bool,
) -> PreparedModel:
    """Read model ``name`` from ``path`` for an engine of ``config`` on ``device`` (in
    ``dtype``, default the checkpoint's); with ``timing``, measure its layer copies."""
    config_json = read_config(path)
    arch = ArchConfig.from_hf(config_json)
    model_dtype = dtype or TORCH_DTYPES[arch.dtype]
    pin = device.type == "cuda"
    # Only the decoder layers are ever copied again: they alone are pinned.
    host = load_host_weights(path, arch, dtype=model_dtype, pin=False)
    packed = pack_layers(host, pin=pin)
    shape = kv_block_shape(arch, config.block_tokens)
    tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
    return PreparedModel(
        name=name,
        spec=model_spec_from_config(
            config_json, name, dtype=None if dtype is None else DTYPE_NAMES[dtype]
        ),
        arch=arch,
        dtype=model_dtype,
        host=host,
        packed=packed,
        kv_shape=shape,
        host_kv=host_swap_space(config.host_swap_bytes, shape, model_dtype, pin=pin),
        eos_token_ids=eos_token_ids(path),
        token_bytes=token_bytes(tokenizer),
        tokenizer_json=tokenizer.to_str(),
        timing=measure_timing(packed, device) if timing else None,
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
        self.device, self.dtype = device, dtype
        prepared = {
            name: prepare_model(name, path, config, device, dtype, timing=config.remap.enabled)
            for name, path in models.items()
        }
        device_kv = {name: self.arena.kv_cache(p.kv_shape, p.dtype) for name, p in prepared.items()}
        self.transfers = make_transfers(device_kv, {n: p.host_kv for n, p in prepared.items()})
        self.executor = TorchExecutor(self.transfers)
        self.packed = {name: p.packed for name, p in prepared.items()}
        timings = None
        if config.remap.enabled:
            timings = {name: p.timing for name, p in prepared.items() if p.timing is not None}
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
        self.host_weights = {name: p.host for name, p in prepared.items()}
        for name, p in prepared.items():
            self._serve(p, device_kv[name])
        self.totals = Totals()
        self._ids = itertools.count()
        self._arena_version = -1
        self._remapped = 0

    def prepare_model(self, name: str, path: Path) -> PreparedModel:
        """Read a model directory for ``change_models``. Any thread may call it (it
        touches nothing of the running engine), so the engine keeps stepping while a
        model loads."""
        config = self.core.config
        return prepare_model(
            name, path, config, self.device, self.dtype, timing=config.remap.enabled
        )

    def change_models(
        self, removing: Sequence[str], adding: Sequence[tuple[PreparedModel, TenantSpec, int]]
    ) -> None:
        """Stop serving ``removing`` and serve ``adding`` (each prepared model with its
        tenancy and the KV tokens it must have room for), between two steps; call it
        on the engine's thread. The other models' requests stay as they are. Raises
        ValueError (``NoRoom`` when it does not fit), changing nothing; see
        ``EngineCore.change_models``."""
        new = [NewModel(p.spec, tenant, tokens, p.timing) for p, tenant, tokens in adding]
        self.core.change_models(removing, new)
        for name in removing:
            self.executor.remove_model(name)
            self.transfers.remove_model(name)
            del self.packed[name], self.host_weights[name]
        for p, _, _ in adding:
            kv = self.arena.kv_cache(p.kv_shape, p.dtype)
            self.transfers.add_model(p.name, kv, p.host_kv)
            self.packed[p.name], self.host_weights[p.name] = p.packed, p.host
            self._serve(p, kv)

    def _serve(self, p: PreparedModel, kv_cache: torch.Tensor) -> None:
        """Copy a prepared model into its pages (placed by the core) and run it."""
        config = self.core.config
        layout = self.core.memory.weights[p.name]
        weights = self.arena.place_weights(p.host, p.packed, layout)
        served = ServedModel(
            model=Transformer(p.arch, weights),
            kv_cache=kv_cache,
            block_tokens=config.block_tokens,
            eos_token_ids=p.eos_token_ids,
            token_bytes=p.token_bytes,
            frames=WeightFrames(p.packed, self.arena.frames(layout, p.packed)),
            tokenizer_json=p.tokenizer_json,
        )
        model = served.model
        if not config.enforce_eager and uses_triton(kv_cache) and graphs_apply(model):
            static = StaticDecode(
                model,
                kv_cache,
                config.block_tokens,
                max_batch=config.scheduler.max_running,
                frames=served.frames,
            )
            served.static = capture_or_eager(static, p.name)
        self.executor.add_model(p.name, served)

    def add_request(
        self,
        model: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        slo: SloSpec = DEFAULT_SLO,
        t_arr: float | None = None,
        cache_salt: str | None = None,
    ) -> str:
        """Queue a request that arrived at ``t_arr`` on the core's clock (default now);
        returns its id. With prefix caching, its prompt shares KV only with requests of
        the same ``cache_salt``."""
        request = Request(
            id=f"req-{next(self._ids)}",
            model=model,
            prompt_tokens=len(prompt_ids),
            max_output_tokens=params.max_tokens,
            slo=slo,
            t_arr=self.core.clock.now() if t_arr is None else t_arr,
            prompt_token_ids=list(prompt_ids),
            cache_salt=cache_salt,
        )
        self.core.add_request(request)
        self.executor.add_request(request.id, model, params, prompt_ids)
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
                    stop_reason=self.executor.stop_reason(request.id),
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
