"""What every route of a server shares: its models, engine loop, metrics and settings."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aiohttp import web

from shunter.engine.config import SloSpec
from shunter.engine.server.errors import unavailable
from shunter.engine.server.loop import EngineLoop
from shunter.engine.server.metrics import ServerMetrics
from shunter.engine.server.models import ServedModel
from shunter.engine.server.protocol import GenerationRequest
from shunter.engine.server.settings import EngineSettings

Build = Callable[[EngineSettings], tuple[EngineLoop, dict[str, ServedModel]]]


@dataclass
class ServerState:
    """One server. ``token`` (None: no auth) guards every route but ``/health``;
    ``draining`` refuses new generation requests, and so does ``reconciling`` while
    ``PUT /admin/deployments`` replaces the engine; on shutdown, requests in flight get
    ``grace_s`` seconds to finish before they are aborted. A stream that has sent
    nothing for ``keepalive_s`` seconds gets an SSE comment. ``build`` makes a new engine
    loop and model table for other settings (with the same metrics). ``loop`` is None
    while a reload has released the old engine and not yet started the new one, and
    after a reload whose desired set and previous set both failed to load (``failure``
    says why): then ``engine_loop`` answers 503."""

    models: Mapping[str, ServedModel]
    loop: EngineLoop | None
    metrics: ServerMetrics
    settings: EngineSettings
    build: Build
    token: str | None = None
    grace_s: float = 30.0
    keepalive_s: float = 5.0
    draining: bool = False
    reconciling: bool = False
    reconcile_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    started: int = field(default_factory=lambda: int(time.time()))
    failure: str | None = None

    @property
    def admitting(self) -> bool:
        return not (self.draining or self.reconciling)

    def engine_loop(self) -> EngineLoop:
        """The running engine loop; 503 while there is none."""
        if self.loop is None:
            raise unavailable(
                f"The engine serves no models: {self.failure or 'it is loading its models'}"
            )
        return self.loop

    def slo_of(self, model: str) -> SloSpec | None:
        return self.models[model].arg.slo

    def check_capacity(self, gen: GenerationRequest) -> None:
        """503 when one choice could never fit the model's device KV blocks."""
        memory = self.engine_loop().engine.core.memory
        total = memory.num_total_blocks(gen.model)
        for prompt in gen.prompts:
            need = memory.num_blocks(len(prompt) + gen.params.max_tokens)
            if need > total:
                raise unavailable(
                    f"The engine cannot admit this request: {len(prompt)} prompt tokens plus "
                    f"max_tokens {gen.params.max_tokens} need {need} KV blocks, and model "
                    f"{gen.model!r} has {total}."
                )


STATE = web.AppKey("state", ServerState)
REQUEST_ID = web.RequestKey("request_id", str)
