"""The aiohttp application: routes, auth, request ids, errors, and graceful shutdown.

Routes: ``GET /health`` (no auth), ``GET /v1/models`` and ``/v1/models/{id}``,
``POST /v1/completions``,
``POST /v1/chat/completions``, ``GET /metrics``, ``GET /admin/state``,
``POST /admin/drain``, ``PUT /admin/deployments``. With a token set, every route but
``/health`` needs ``Authorization: Bearer TOKEN``. Every error is an OpenAI error body,
never a traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import http_exceptions, web

from shunter.engine.api.errors import ApiError
from shunter.engine.api.jsonbody import MAX_BODY_BYTES
from shunter.engine.server.context import REQUEST_ID, STATE, ServerState
from shunter.engine.server.deployments import put_deployments
from shunter.engine.server.openai_api import chat_completions, completions
from shunter.engine.server.state import with_config

log = logging.getLogger("shunter.engine.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class MalformedRequests(logging.Filter):
    """aiohttp logs every request its parser refuses (a header past its limit, a broken
    request line) with a traceback at ERROR: a client could fill the log with them. They
    are the client's fault and answered with a 400, so one warning line without the
    traceback says enough."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, http_exceptions.HttpProcessingError) and error.code < 500:
            record.msg = f"{record.msg}: refused a malformed request (%s)"
            record.args = (*(record.args or ()), error.message)
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_malformed = MalformedRequests()


def build_app(state: ServerState, *, max_body_bytes: int = MAX_BODY_BYTES) -> web.Application:
    """The server's application. It starts ``state.loop`` on startup; on shutdown it stops
    admitting, gives requests in flight ``state.grace_s`` seconds, aborts the rest and
    stops the loop."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[request_ids, errors, auth])
    app[STATE] = state
    logging.getLogger("aiohttp.server").addFilter(_malformed)  # once: a filter is kept once
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/state", admin_state)
    app.router.add_post("/admin/drain", admin_drain)
    app.router.add_put("/admin/deployments", put_deployments)
    app.on_startup.append(_start)
    app.on_shutdown.append(_shutdown)
    app.on_cleanup.append(_cleanup)
    return app


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        return web.json_response(e.body(), status=e.status)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        kind = "invalid_request_error" if e.status < 500 else "server_error"
        error = ApiError(e.status, e.reason, type=kind, code=None)
        headers: dict[str, str] = {}
        if isinstance(e, web.HTTPNotFound):
            error.message, error.code = f"No route {request.method} {request.path}.", "unknown_url"
        elif isinstance(e, web.HTTPMethodNotAllowed):
            headers["Allow"] = e.headers["Allow"]
            error.message = f"Use {e.headers['Allow']} on {request.path}."
            error.code = "method_not_allowed"
        return web.json_response(error.body(), status=e.status, headers=headers)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        error = ApiError(500, "Internal server error.", type="server_error")
        return web.json_response(error.body(), status=500)


@web.middleware
async def request_ids(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Take ``X-Request-Id`` (or make one) and return it on every response."""
    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    request[REQUEST_ID] = request_id
    response = await handler(request)
    if not response.prepared:
        response.headers["X-Request-Id"] = request_id
    return response


@web.middleware
async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The engine token on every route but ``/health``; on ``/metrics`` the scrape
    token too, or none with ``open_metrics``."""
    state = request.app[STATE]
    if not state.token or request.path == "/health":
        return await handler(request)
    accepted = [state.token]
    if request.path == "/metrics":
        if state.open_metrics:
            return await handler(request)
        if state.metrics_token:
            accepted.append(state.metrics_token)
    given = request.headers.get("Authorization", "").encode()
    # Every token is compared (no early exit), in constant time each.
    matches = [hmac.compare_digest(given, f"Bearer {t}".encode()) for t in accepted]
    if not any(matches):
        raise ApiError(
            401,
            "Missing or invalid bearer token.",
            type="authentication_error",
            code="invalid_api_key",
        )
    return await handler(request)


async def health(request: web.Request) -> web.Response:
    """200 ``{"status": "ok"}``; 503 ``draining``, or ``stalled`` when the engine loop
    has published no snapshot for its ``stall_after_s`` while busy. Answers from the
    loop's snapshot, never waiting for a step: a long step is not a failure.
    A stalled answer carries ``snapshot_age_s``, the age of the last snapshot."""
    state = request.app[STATE]
    if state.draining:
        return web.json_response({"status": "draining"}, status=503)
    loop = state.loop
    if loop.stalled:
        age = round(loop.snapshot.age_s(), 3)
        return web.json_response({"status": "stalled", "snapshot_age_s": age}, status=503)
    return web.json_response({"status": "ok"})


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    data = [_model_object(state, name) for name in state.models]
    return web.json_response({"object": "list", "data": data})


async def get_model(request: web.Request) -> web.Response:
    """``GET /v1/models/{model}``: one served model, or 404 ``model_not_found``."""
    state, name = request.app[STATE], request.match_info["model"]
    if name not in state.models:
        raise ApiError(
            404,
            f"The model {name!r} does not exist.",
            type="invalid_request_error",
            code="model_not_found",
        )
    return web.json_response(_model_object(state, name))


def _model_object(state: ServerState, name: str) -> dict[str, object]:
    return {
        "id": name,
        "object": "model",
        "created": state.started,
        "owned_by": "shunter",
        "max_model_len": state.models[name].max_context,
    }


async def metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def admin_state(request: web.Request) -> web.Response:
    """The engine loop's latest snapshot (``engine.server.state``), never waiting for a
    step, with ``t_snapshot`` (Unix time it was taken), ``snapshot_age_s`` and
    ``stalled`` (see ``health``), ``draining``, and ``reconciling`` (a deployment
    change is under way; the models it does not touch keep serving)."""
    state = request.app[STATE]
    loop = state.loop
    published = loop.snapshot
    age = published.age_s()
    snapshot = dataclasses.replace(
        with_config(published.state, state.models),
        t_snapshot=time.time() - age,
        snapshot_age_s=age,
        stalled=loop.stalled,
        draining=state.draining,
        reconciling=state.reconcile_lock.locked(),
    )
    return web.json_response(snapshot.to_json())


async def admin_drain(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.draining = True
    streams = state.loop.num_streams
    return web.json_response({"draining": True, "streams": streams})


async def _start(app: web.Application) -> None:
    app[STATE].loop.start()


async def _shutdown(app: web.Application) -> None:
    state = app[STATE]
    state.draining = True
    deadline = time.monotonic() + state.grace_s
    while state.loop.num_streams and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await _stop_loop(state)


async def _cleanup(app: web.Application) -> None:
    await _stop_loop(app[STATE])


async def _stop_loop(state: ServerState) -> None:
    """Stop the engine loop (once): anything still running gets an abort delta and ends
    its response."""
    await asyncio.to_thread(state.loop.stop)
