"""TorchEngine: EngineCore wired to real models, for offline generation and tests.

It builds the pieces in dependency order: the models' host weights, the device arena
and the host swap space, the executor and transfers, the core (whose KVMemory places
the weights), then the weights copied into their pages.
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
from shunter.engine.exec.hf_config import (
    ArchConfig,
    eos_token_ids,
    model_spec_from_config,
    read_config,
)
from shunter.engine.exec.loader import TORCH_DTYPES, load_host_weights
from shunter.engine.exec.model import Transformer, kv_block_shape
from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.torch_executor import ServedModel, TorchExecutor
from shunter.engine.exec.transfers import BlockingTransfers, host_swap_space
from shunter.engine.interfaces import MonotonicClock
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
    """Counts over every step run so far."""

    steps: int = 0
    preemptions: int = 0
    blocks_swapped_out: int = 0
    blocks_swapped_in: int = 0
    blocks_rotated: int = 0

    def add(self, stats: StepStats) -> None:
        self.steps += 1
        self.preemptions += stats.num_preempted
        self.blocks_swapped_out += stats.d2h_blocks
        self.blocks_swapped_in += stats.h2d_blocks
        self.blocks_rotated += stats.rotated_blocks


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
    moved, so callers can see rotation happen.
    """

    def __init__(
        self,
        models: Mapping[str, Path],
        config: EngineConfig,
        *,
        device: torch.device,
        dtype: torch.dtype | None = None,
    ) -> None:
        if config.models != model_specs(models, dtype):
            raise ValueError("config.models must be model_specs(models, dtype)")
        self.arena = DeviceArena(config.num_pages, config.page_bytes, device)
        self.executor = TorchExecutor()
        hosts, device_kv, host_kv = {}, {}, {}
        for name, path in models.items():
            arch = ArchConfig.from_hf(read_config(path))
            model_dtype = dtype or TORCH_DTYPES[arch.dtype]
            pin = device.type == "cuda"
            hosts[name] = (arch, load_host_weights(path, arch, dtype=model_dtype, pin=pin))
            shape = kv_block_shape(arch, config.block_tokens)
            device_kv[name] = self.arena.kv_cache(shape, model_dtype)
            host_kv[name] = host_swap_space(config.host_swap_bytes, shape, model_dtype, pin=pin)
        self.core = EngineCore(
            config, self.executor, BlockingTransfers(device_kv, host_kv), MonotonicClock()
        )
        for name, path in models.items():
            arch, host = hosts[name]
            weights = self.arena.place_weights(host, self.core.memory.weights[name])
            tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
            served = ServedModel(
                model=Transformer(arch, weights),
                kv_cache=device_kv[name],
                block_tokens=config.block_tokens,
                eos_token_ids=eos_token_ids(path),
                token_bytes=token_bytes(tokenizer),
            )
            self.executor.add_model(name, served)
        self.executor.bind(self.core.scheduler.requests, self.core.memory.block_ids)
        self.host_weights = {name: host for name, (_, host) in hosts.items()}
        self.totals = Totals()
        self._ids = itertools.count()

    def add_request(
        self,
        model: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        slo: SloSpec = DEFAULT_SLO,
    ) -> str:
        """Queue a request now; returns its id."""
        request = Request(
            id=f"req-{next(self._ids)}",
            model=model,
            prompt_tokens=len(prompt_ids),
            max_output_tokens=params.max_tokens,
            slo=slo,
            t_arr=self.core.clock.now(),
            prompt_token_ids=list(prompt_ids),
        )
        self.core.add_request(request)
        self.executor.add_request(request.id, model, params)
        return request.id

    def step(self) -> list[Output]:
        stats = self.core.step()
        self.totals.add(stats)
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

    def run(self) -> dict[str, Output]:
        """Step until idle; every request finished meanwhile, by id."""
        done: dict[str, Output] = {}
        while not self.core.is_idle():
            done.update((o.request_id, o) for o in self.step())
        return done
