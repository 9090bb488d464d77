"""``PUT /admin/deployments``: make the served models the desired set, without a restart.

The body is the models part of the engine's settings (as in ``deploy/engine.toml``)::

    {"models": [{"name", "path", "sharing", "priority", "slo", "kv_floor", "kv_ceiling",
                 "max_context", "share_prefixes"}], "slo_classes": {...}}

Models whose name and directory stay are kept. When only their sharing mode, priority,
SLO class, KV bounds, ``max_context`` or ``share_prefixes`` change, the running scheduler
takes them between two steps and nothing stops (live requests keep the SLO class they
arrived with; requests from then on are salted by the new ``share_prefixes``).

Adding, removing or reloading (a new directory) a model touches that model alone: every
other model's requests go on as they are. The added models' weights are read from disk
on a worker thread while the engine keeps stepping; then, between two steps, the removed
models' pages (weights and KV) go back to the free pages and the added models' weights
are placed into free runs of the arena, after the chunks other models hold without a
used block were given back (``EngineCore.change_models``). The arena does not grow: when
the added models' weights or a full context of each (``max_context``) would not fit
even so, or a live request of another model would no longer fit, the change is refused
with 409, with the bytes needed, free and reclaimable, before anything changes. Requests
of removed or reloaded models end at once with an error chunk. An added model that
fails to load changes nothing (500). The engine is never rebuilt (the response's
``rebuilt`` is always false). A desired set that cannot be served (a missing directory,
a config that does not fit) is refused with 400 before anything changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from typing import Any

from aiohttp import web

from shunter.engine.api.deployments import DEPLOYMENT_KEYS
from shunter.engine.api.errors import ApiError, bad_request
from shunter.engine.errors import ServeError
from shunter.engine.exec.serving import model_specs
from shunter.engine.memory.kv_memory import NoRoom
from shunter.engine.server.context import STATE, ServerState
from shunter.engine.server.models import load_served_model
from shunter.engine.server.openai_api import read_json
from shunter.engine.server.serve import context_tokens, engine_config, freeze_heap, tenant_specs
from shunter.engine.server.settings import (
    EngineSettings,
    SettingsError,
    check_model_dirs,
    settings_from_dict,
)

log = logging.getLogger("shunter.engine.server")


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
    except (SettingsError, ServeError, ValueError, KeyError, OSError) as e:
        raise bad_request(f"The desired deployments cannot be served: {e}") from None
    async with state.reconcile_lock:
        return web.json_response(await reconcile(state, desired))


async def reconcile(state: ServerState, desired: EngineSettings) -> dict[str, Any]:
    """Serve ``desired`` in the running engine; what changed, by model name."""
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
        "rebuilt": False,
    }
    if added or removed or reloaded:
        await _change_models(state, desired, sorted({*removed, *reloaded}), added + reloaded)
    await _retenant(state, desired)
    for name in reconfigured:
        state.models[name].arg = want[name]
    state.settings = desired
    for name in removed:
        state.metrics.forget(name)
    return result


async def _change_models(
    state: ServerState, desired: EngineSettings, removing: list[str], adding: list[str]
) -> None:
    """Stop serving ``removing`` and serve ``adding`` (as ``desired`` has them) in the
    running engine; see the module docstring. 409 when they do not fit, 500 when an
    added model fails to load: nothing changed then."""
    loop = state.loop
    engine, core = loop.engine, loop.engine.core
    want = {m.name: m for m in desired.models}
    tenants = {t.model: t for t in tenant_specs(desired)}
    specs = dict(zip(adding, model_specs({n: want[n].path for n in adding}), strict=True))
    needs = [(specs[n], context_tokens(want[n], specs[n])) for n in adding]

    def check_room() -> None:
        others = [r for r in core.scheduler.requests.values() if r.model not in removing]
        floors = {n: tenants[n].kv_floor for n in adding}
        core.memory.check_room(needs, removing, others, floors)

    try:
        await loop.call(check_room)
    except NoRoom as e:
        raise _no_room(e) from None
    try:
        prepared = [await asyncio.to_thread(engine.prepare_model, n, want[n].path) for n in adding]
        served = {n: await asyncio.to_thread(load_served_model, want[n], specs[n]) for n in adding}
    except Exception as e:
        log.exception("loading the added models failed; the served set stays as it is")
        raise ApiError(
            500,
            f"Loading the desired deployments failed ({e}); the previous set is served again.",
            type="server_error",
        ) from None
    # Out of the model table first: no new request reaches a model on its way out.
    kept = dict(state.models)
    state.models = {n: m for n, m in kept.items() if n not in removing}
    ending = set(removing)

    def end_requests() -> bool:
        """Abort the leaving models' requests; whether their copies all completed."""
        loop.abort_models(ending, "the model was removed or reloaded")
        return all(core.memory.can_remove_model(m) for m in ending)

    while not await loop.call(end_requests):
        await asyncio.sleep(0.01)  # the engine steps until their copies complete
    change = [(p, tenants[p.name], tokens) for p, (_, tokens) in zip(prepared, needs, strict=True)]
    try:
        await loop.call(functools.partial(engine.change_models, removing, change))
    except NoRoom as e:
        state.models = kept
        raise _no_room(e) from None
    state.models = {**state.models, **served}
    await loop.call(freeze_heap)  # the new models' objects are long-lived too


def _no_room(e: NoRoom) -> ApiError:
    return ApiError(
        409,
        f"The desired deployments do not fit the engine's memory: {e}.",
        code="insufficient_memory",
    )


async def _retenant(state: ServerState, desired: EngineSettings) -> None:
    """Give the running scheduler the desired sharing modes, priorities, SLO classes and
    KV bounds between two steps; a 400 (nothing changed) when a live request would no
    longer fit its model's bounds."""
    tenants = tenant_specs(desired)
    loop = state.loop
    core = loop.engine.core

    def apply() -> None:
        core.scheduler.set_tenants(tenants)
        core.config = dataclasses.replace(core.config, tenants=tenants)

    try:
        await loop.call(apply)
    except ValueError as e:
        raise bad_request(f"The desired deployments cannot be applied now: {e}") from None
