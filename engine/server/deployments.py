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
import functools
import gc
import logging
import time
from typing import Any

import torch
from aiohttp import web

from shunter.engine.exec.generate_input import GenerateError
from shunter.engine.server.context import STATE, ServerState
from shunter.engine.server.errors import ApiError, bad_request
from shunter.engine.server.loop import EngineLoop
from shunter.engine.server.models import ServedModel
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
    """Serve ``desired``; what changed, by model name. Without an engine (a reload that
    failed) every desired model is loaded anew."""
    current = {m.name: m for m in state.settings.models} if state.loop is not None else {}
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
    loop = state.engine_loop()
    core = loop.engine.core

    def apply() -> None:
        core.scheduler.set_tenants(tenants)
        core.config = dataclasses.replace(core.config, tenants=tenants)

    try:
        await loop.call(apply)
    except ValueError as e:
        raise bad_request(f"The desired deployments cannot be applied now: {e}") from None


async def _replace_engine(state: ServerState, desired: EngineSettings, ending: set[str]) -> None:
    """Stop the old engine and free it (its device memory too) before building the
    desired one, so both never need the device at once. When the desired set fails to
    load the previous one is loaded again (a 500); when that fails too the server keeps
    no engine (503 to generation requests, the error in ``/admin/state``) until a later
    desired set loads."""
    if state.loop is not None:
        await _stop_engine(state, ending)
    try:
        loop, served = await asyncio.to_thread(state.build, desired)
    except Exception as e:
        log.exception("building the desired deployments failed; restoring the previous set")
        await asyncio.to_thread(_release_device_memory)
        try:
            loop, served = await asyncio.to_thread(state.build, state.settings)
        except Exception as again:
            log.exception("restoring the previous deployments failed too")
            await asyncio.to_thread(_release_device_memory)
            state.failure = (
                f"loading the desired deployments failed ({e}), and so did loading the "
                f"previous ones again ({again}); PUT /admin/deployments to load a set"
            )
            raise ApiError(
                500,
                f"Loading the desired deployments failed, and so did restoring the previous "
                f"set: the engine serves no models. {state.failure}.",
                type="server_error",
            ) from None
        _serve(state, loop, served, state.settings)
        raise ApiError(
            500,
            f"Loading the desired deployments failed ({e}); the previous set is served again.",
            type="server_error",
        ) from None
    _serve(state, loop, served, desired)


async def _stop_engine(state: ServerState, ending: set[str]) -> None:
    """End the requests of ``ending`` models at once, give the others the grace period,
    stop the engine loop and drop every reference to its engine."""
    old = state.loop
    assert old is not None
    await old.call(functools.partial(old.abort_models, ending, "the model was removed or reloaded"))
    deadline = time.monotonic() + state.grace_s
    while old.num_streams and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.to_thread(old.stop, "the engine is reloading its models")
    state.loop, state.models = None, {}
    del old
    await asyncio.to_thread(_release_device_memory)


def _release_device_memory() -> None:
    """Collect the engines nothing refers to any more and hand their device memory back
    to the driver, so the next build finds it free."""
    gc.collect()
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.empty_cache()


def _serve(
    state: ServerState,
    loop: EngineLoop,
    served: dict[str, ServedModel],
    settings: EngineSettings,
) -> None:
    loop.start()
    state.loop, state.models, state.settings, state.failure = loop, served, settings, None
