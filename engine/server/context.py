"""What every route of a server shares: its models, engine loop, metrics and settings."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web

from shunter.engine.api.errors import unavailable
from shunter.engine.api.protocol import GenerationRequest
from shunter.engine.config import SloSpec
from shunter.engine.server.loop import EngineLoop
from shunter.engine.server.metrics import ServerMetrics
from shunter.engine.server.models import ServedModel
from shunter.engine.server.settings import EngineSettings


@dataclass
class ServerState:
    """One server. ``token`` (None: no auth) guards every route but ``/health``;
    ``/metrics`` also takes ``metrics_token`` (a scraper's, which opens nothing else),
    or no token at all with ``open_metrics``;
    ``draining`` refuses new generation requests; on shutdown, requests in flight get
    ``grace_s`` seconds to finish before they are aborted. A stream that has sent
    nothing for ``keepalive_s`` seconds gets an SSE comment. ``reconcile_lock`` is held
    while ``PUT /admin/deployments`` changes the served models (one change at a time)."""

    models: Mapping[str, ServedModel]
    loop: EngineLoop
    metrics: ServerMetrics
    settings: EngineSettings
    token: str | None = None
    metrics_token: str | None = None
    open_metrics: bool = False
    grace_s: float = 30.0
    keepalive_s: float = 5.0
    draining: bool = False
    reconcile_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    started: int = field(default_factory=lambda: int(time.time()))

    def slo_of(self, model: str) -> SloSpec | None:
        return self.models[model].arg.slo

    def check_capacity(self, gen: GenerationRequest) -> None:
        """503 when one choice could never fit the model's device KV blocks."""
        memory = self.loop.engine.core.memory
        for prompt in gen.prompts:
            beyond = memory.out_of_reach(gen.model, len(prompt) + gen.params.max_tokens)
            if beyond is not None:
                raise unavailable(
                    f"The engine cannot admit this request: {len(prompt)} prompt tokens plus "
                    f"max_tokens {gen.params.max_tokens} need {beyond[0]} KV blocks, and "
                    f"model {gen.model!r} has {beyond[1]}."
                )


STATE = web.AppKey("state", ServerState)
REQUEST_ID = web.RequestKey("request_id", str)
