"""The OpenAI-compatible endpoints of the gateway.

``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``, and the same
under ``/models/<name>/v1/``, where the path names the model (a body ``model`` that
disagrees is a 400). Each generation request: authenticate the key, read the body,
choose the deployment, admit it under the tenant's quotas, forward (``proxy.Exchange``).

The handlers take a ``GatewayRequest`` and give a ``Reply``. Two fronts serve them: the
async Django views below (CSRF-exempt: callers authenticate with bearer keys, not
cookies), mounted by ``urls.py``, and the ASGI fast path of ``gateway.asgi``, which
serves the same routes in the web process without Django's per-request thread hops.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import unquote

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from shunter.engine.api.jsonbody import parse_json
from shunter.engine.api.requests import read_request
from shunter.gateway.auth import authenticator
from shunter.gateway.demand import demand_of
from shunter.gateway.errors import ApiError, bad_request, model_not_found
from shunter.gateway.proxy import Exchange
from shunter.gateway.quotas import QuotaUnavailable, quota_limiter
from shunter.gateway.records import starting
from shunter.gateway.replies import (
    GatewayRequest,
    Reply,
    error_reply,
    json_reply,
    new_id,
)
from shunter.gateway.routes import routes

REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
STARTED = int(time.time())
ENDPOINTS = {"models": "GET", "chat/completions": "POST", "completions": "POST"}
QUOTA_RETRY_S = 1  # Retry-After of a request refused because the quotas are unreachable

Handler = Callable[..., Coroutine[Any, Any, Reply]]


def request_id_of(headers: Mapping[str, str]) -> str:
    """The client's ``X-Request-Id`` when it is a sane token, else a new one."""
    given = headers.get("X-Request-Id", "")
    return given if REQUEST_ID.fullmatch(given) else new_id()


async def handle(request: GatewayRequest, endpoint: str, name: str | None = None) -> Reply:
    """Answer ``request`` for ``endpoint`` (``models``, ``chat/completions``,
    ``completions`` or anything else: 404), the path naming model ``name`` or not."""
    if endpoint.startswith("models/") and request.method == "GET":
        return await models_reply(request, name, unquote(endpoint.removeprefix("models/")))
    method = ENDPOINTS.get(endpoint)
    if method is None:
        error = ApiError(404, f"No route {request.method} {request.path}.", code="unknown_url")
        return error_reply(error, request_id_of(request.headers))
    if request.method != method:
        error = ApiError(405, f"Use {method} on {request.path}.", code="method_not_allowed")
        return error_reply(error, request_id_of(request.headers), {"Allow": method})
    if endpoint == "models":
        return await models_reply(request, name)
    return await generate_reply(
        request, "chat" if endpoint == "chat/completions" else endpoint, name
    )


async def models_reply(
    request: GatewayRequest, name: str | None = None, model: str | None = None
) -> Reply:
    """The deployments the key may use (only ``name``'s under its path), OpenAI's list;
    with ``model``, that model's object, or 404 ``model_not_found`` when the key cannot
    see it (as OpenAI answers)."""
    request_id = request_id_of(request.headers)
    try:
        grant = await authenticator.authenticate(request.headers.get("Authorization"))
        if name is not None:
            await routes.choose(grant, name)  # 404 / 403 / 503 as for a generation
        allowed = await routes.allowed(grant)
    except ApiError as e:
        return error_reply(e, request_id)
    context: dict[str, int] = {}
    for route in allowed:
        if name in (None, route.model_name):
            context[route.model_name] = max(context.get(route.model_name, 0), route.context_tokens)
    data = [
        {
            "id": model,
            "object": "model",
            "created": STARTED,
            "owned_by": "shunter",
            "max_model_len": tokens,
        }
        for model, tokens in context.items()
    ]
    headers = {"X-Request-Id": request_id}
    if model is None:
        return json_reply({"object": "list", "data": data}, headers=headers)
    found = [entry for entry in data if entry["id"] == model]
    if not found:
        return error_reply(model_not_found(model), request_id)
    return json_reply(found[0], headers=headers)


def read_body(raw: bytes, path_model: str | None) -> dict[str, Any]:
    """The JSON object body (``jsonbody.parse_json``'s limits) with its ``model``
    (400 otherwise)."""
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    model = body.get("model")
    if path_model is not None:
        if model is None:
            body["model"] = path_model
        elif model != path_model:
            raise bad_request(
                f"The body names model {model!r} but the path is for {path_model!r}.", "model"
            )
    elif not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string.", "model")
    return body


async def generate_reply(request: GatewayRequest, endpoint: str, name: str | None) -> Reply:
    """A chat or completions request, from authentication to the engine's answer."""
    t0 = time.perf_counter()
    arrival = timezone.now()
    # Until its first bytes of output are here (a stream's head, a whole answer) the
    # request is on the gateway's critical path: the records' writes wait.
    with starting:
        return await _generate(request, endpoint, name, t0, arrival)


async def _generate(
    request: GatewayRequest, endpoint: str, name: str | None, t0: float, arrival: datetime
) -> Reply:
    request_id = request_id_of(request.headers)
    headers: dict[str, str] = {}
    try:
        grant = await authenticator.authenticate(request.headers.get("Authorization"))
        body = read_body(request.body, name)
        route = await routes.choose(grant, body["model"])
        # The engine's request models: a field of the wrong type or out of range is the
        # same 400 here, once the key may use the model, before any quota or engine is
        # asked.
        read_request(body, chat=endpoint == "chat")
        demand = demand_of(
            body, endpoint, route.context_tokens, settings.GATEWAY_MAX_SEQUENCES_PER_REQUEST
        )
        try:
            admission = await quota_limiter().admit(
                str(grant.tenant_id),
                grant.limits,
                new_id(),
                sequences=demand.sequences,
                reserve=demand.reserve,
            )
        except QuotaUnavailable:
            # Fail closed: without the counts no quota can be enforced (the limiter logs).
            headers = {"Retry-After": str(QUOTA_RETRY_S)}
            raise ApiError(
                503,
                "Quotas cannot be checked right now; try again shortly.",
                type="service_unavailable",
                code="quota_unavailable",
            ) from None
        if admission.too_large:
            param = "n" if admission.refused == "concurrency" else "max_tokens"
            raise bad_request(admission.message(), param)
        if not admission.admitted:
            headers = admission.headers()
            code = admission.error_code
            raise ApiError(429, admission.message(), type=code, code=code)
    except ApiError as e:
        return error_reply(e, request_id, headers)
    exchange = Exchange(
        grant=grant,
        route=route,
        admission=admission,
        request_id=request_id,
        endpoint=endpoint,
        arrival=arrival,
        t0=t0,
    )
    return await exchange.forward(body)


# -- Django's front ----------------------------------------------------------------------------
def to_django(reply: Reply) -> HttpResponseBase:
    response: HttpResponseBase
    if reply.stream is not None:
        response = StreamingHttpResponse(reply.stream, content_type=reply.content_type)
    else:
        response = HttpResponse(reply.body, status=reply.status, content_type=reply.content_type)
    for name, value in reply.headers.items():
        response[name] = value
    return response


def _django_view(endpoint: str | None) -> Callable[..., Coroutine[Any, Any, HttpResponseBase]]:
    """A view of ``endpoint`` (None: the one in the URL's ``rest``)."""

    async def view(
        request: HttpRequest, name: str | None = None, rest: str = ""
    ) -> HttpResponseBase:
        try:
            body = request.body
        except RequestDataTooBig:
            error = ApiError(413, "The request body is too large.", code="request_too_large")
            return to_django(error_reply(error, request_id_of(request.headers)))
        gateway_request = GatewayRequest(
            request.method or "GET", request.path, request.headers, body
        )
        return to_django(await handle(gateway_request, endpoint or rest, name))

    return csrf_exempt(view)


models = _django_view("models")
chat_completions = _django_view("chat/completions")
completions = _django_view("completions")
unknown = _django_view(None)
