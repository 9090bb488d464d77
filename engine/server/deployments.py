"""``PUT /admin/deployments``: make the served models the desired set, without a restart.

The body is the models part of the engine's settings (as in ``deploy/engine.toml``)::

    {"models": [{"name", "path", "sharing", "priority", "slo", "kv_floor", "kv_ceiling",
                 "max_context"}], "slo_classes": {...}}

Models whose name and directory stay are kept. When only their sharing mode, priority,
SLO class, KV bounds or ``max_context`` change, the running scheduler takes them between
two steps and nothing stops (live requests keep the SLO class they arrived with). When
a model is added, removed or its directory changes, the engine is rebuilt with the
desired set: admission stops, requests of removed or reloaded models end at once with an
error chunk, the others get the grace period to finish (the rest end with an error
chunk), then the new engine starts. A desired set that cannot be served (a missing
directory, a config that does not fit) is refused with 400 before anything stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from aiohttp import web

from shunter.engine.exec.generate_input import GenerateError
from shunter.engine.server.context import STATE, ServerState
from shunter.engine.server.errors import ApiError, bad_request
from shunter.engine.server.openai_api import read_json
from shunter.engine.server.serve import engine_config, tenant_specs
from shunter.engine.server.settings import (
    EngineSettings,
    SettingsError,
    check_model_dirs,
    settings_from_dict,
)

log = logging.getLogger("shunter.engine.server")
DEPLOYMENT_KEYS = {"models", "slo_classes"}


async def put_deployments(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = await read_json(request)
    if not isinstance(body, dict) or "models" not in body or set(body) - DEPLOYMENT_KEYS:
        raise bad_request("The body must be an object with 'models' and optional 'slo_classes'.")
    try:
        parsed = settings_from_dict(body, "deployments")
        desired = dataclasses.replace(
            state.settings, models=parsed.models, slo_classes=parsed.slo_classes
        )
        check_model_dirs(desired)
        await asyncio.to_thread(engine_config, desired)
    except (SettingsError, GenerateError, ValueError, KeyError, OSError) as e:
        raise bad_request(f"The desired deployments cannot be served: {e}") from None
    async with state.reconcile_lock:
        return web.json_response(await reconcile(state, desired))


async def reconcile(state: ServerState, desired: EngineSettings) -> dict[str, Any]:
    """Serve ``desired``; what changed, by model name."""
    current = {m.name: m for m in state.settings.models}
    want = {m.name: m for m in desired.models}
    kept = current.keys() & want.keys()
    removed = sorted(current.keys() - want.keys())
    added = sorted(want.keys() - current.keys())
    reloaded = sorted(n for n in kept if current[n].path != want[n].path)
    reconfigured = sorted(n for n in kept if n not in reloaded and current[n] != want[n])
    result = {
        "added": added,
        "removed": removed,
        "reloaded": reloaded,
        "reconfigured": reconfigured,
        "rebuilt": bool(added or removed or reloaded),
    }
    if not result["rebuilt"]:
        await _retenant(state, desired)
        for name in reconfigured:
            state.models[name].arg = want[name]
        state.settings = desired
        return result
    state.reconciling = True
    try:
        await _replace_engine(state, desired, set(removed) | set(reloaded))
    finally:
        state.reconciling = False
    for name in removed:
        state.metrics.forget(name)
    return result


async def _retenant(state: ServerState, desired: EngineSettings) -> None:
    """Give the running scheduler the desired sharing modes, priorities, SLO classes and
    KV bounds between two steps; a 400 (nothing changed) when a live request would no
    longer fit its model's bounds."""
    tenants = tenant_specs(desired)
    core = state.loop.engine.core

    def apply() -> None:
        core.scheduler.set_tenants(tenants)
        core.config = dataclasses.replace(core.config, tenants=tenants)

    try:
        await state.loop.call(apply)
    except ValueError as e:
        raise bad_request(f"The desired deployments cannot be applied now: {e}") from None


async def _replace_engine(state: ServerState, desired: EngineSettings, ending: set[str]) -> None:
    old = state.loop
    await old.call(lambda: old.abort_models(ending, "the model was removed or reloaded"))
    deadline = time.monotonic() + state.grace_s
    while old.num_streams and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.to_thread(old.stop, "the engine is reloading its models")
    try:
        loop, served = await asyncio.to_thread(state.build, desired)
    except Exception:
        log.exception("building the desired deployments failed; restoring the previous set")
        loop, served = await asyncio.to_thread(state.build, state.settings)
        loop.start()
        state.loop, state.models = loop, served
        raise ApiError(
            500,
            "Loading the desired deployments failed; the previous set is served again.",
            type="server_error",
        ) from None
    loop.start()
    state.loop, state.models, state.settings = loop, served, desired
