"""The gateway's ASGI fast path: ``/v1/...`` and ``/models/<name>/v1/...`` served straight
from the ASGI scope by the same handlers as the Django views, everything else passed to
Django.

Django's ASGI handler runs every request's signals, sync middleware and response closing
in a fresh thread per request; under concurrent streams those thread hops dominate the
gateway's latency (see ``shunter bench gateway``). The fast path keeps what the gateway's
routes need from that stack, with the same settings: the allowed hosts, the HTTPS
redirect, HSTS and ``nosniff`` of the security middleware. A client that disconnects
cancels its handler, which aborts the request upstream and releases its quota lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.datastructures import CaseInsensitiveMapping

from shunter.gateway.errors import ApiError
from shunter.gateway.proxy import close_upstream
from shunter.gateway.records import records
from shunter.gateway.replies import GatewayRequest, Reply, error_reply
from shunter.gateway.views import handle, request_id_of

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]

log = logging.getLogger("shunter.gateway")
ROUTE = re.compile(r"^/(?:models/(?P<name>[^/]+)/)?v1/(?P<endpoint>.*)$")
# The gateway's part of the URL space: a path here that ROUTE does not match (``/v1``, a
# name with an encoded ``/``) is the gateway's 404, not Django's HTML one.
GATEWAY_PATH = re.compile(r"^/(?:v1|models)(?:/|$)")


class Disconnected(Exception):
    """The client went away."""


class GatewayFastPath:
    """ASGI middleware: the gateway's routes here, the rest to ``app`` (Django)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.max_body = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        self.allowed_hosts = list(settings.ALLOWED_HOSTS)
        if settings.DEBUG and not self.allowed_hosts:
            self.allowed_hosts = [".localhost", "127.0.0.1", "[::1]"]
        self.https_headers: list[tuple[bytes, bytes]] = []
        if settings.SECURE_HSTS_SECONDS:
            hsts = f"max-age={settings.SECURE_HSTS_SECONDS}"
            hsts += "; includeSubDomains" if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS else ""
            hsts += "; preload" if settings.SECURE_HSTS_PRELOAD else ""
            self.https_headers.append((b"strict-transport-security", hsts.encode()))
        if settings.SECURE_CONTENT_TYPE_NOSNIFF:
            self.https_headers.append((b"x-content-type-options", b"nosniff"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not GATEWAY_PATH.match(scope["path"]):
            await self.app(scope, receive, send)
            return
        match = ROUTE.match(scope["path"])
        endpoint, name = (match["endpoint"], match["name"]) if match else ("", None)
        headers = CaseInsensitiveMapping(
            {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        )
        secure = scope.get("scheme") == "https"
        refusal = self._refusal(scope, headers, secure)
        if refusal is not None:
            await self._send(refusal, send, secure)
            return
        try:
            body = await self._read_body(receive)
        except Disconnected:
            return
        except ApiError as e:
            await self._send(error_reply(e, request_id_of(headers)), send, secure)
            return
        request = GatewayRequest(scope["method"], scope["path"], headers, body)
        respond = asyncio.ensure_future(self._respond(request, endpoint, name, send, secure))
        disconnect = asyncio.ensure_future(_disconnected(receive))
        done, _ = await asyncio.wait({respond, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        for task in (respond, disconnect):
            if task not in done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Disconnected):
                    await task
        if respond in done:
            respond.result()

    def _refusal(
        self, scope: Scope, headers: CaseInsensitiveMapping[str], secure: bool
    ) -> Reply | None:
        """What the security and common middleware would answer instead: 400 for a host
        not allowed, a redirect to HTTPS when it is required."""
        host = headers.get("Host", "")
        domain, _ = split_domain_port(host)
        if not domain or not validate_host(domain, self.allowed_hosts):
            error = ApiError(400, "The Host header names a host this server does not serve.")
            return error_reply(error, request_id_of(headers))
        if settings.SECURE_SSL_REDIRECT and not secure:
            query = scope.get("query_string", b"").decode("latin-1")
            location = f"https://{host}{scope['path']}" + (f"?{query}" if query else "")
            return Reply(301, {"Location": location})
        return None

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise ApiError(413, "The request body is too large.", code="request_too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _respond(
        self, request: GatewayRequest, endpoint: str, name: str | None, send: Send, secure: bool
    ) -> None:
        try:
            reply = await handle(request, endpoint, name)
        except Exception:
            log.exception("unhandled error in %s %s", request.method, request.path)
            error = ApiError(500, "Internal server error.", type="server_error")
            reply = error_reply(error, request_id_of(request.headers))
        await self._send(reply, send, secure)

    async def _send(self, reply: Reply, send: Send, secure: bool) -> None:
        headers = [(b"content-type", reply.content_type.encode())]
        headers += [(k.lower().encode(), v.encode("latin-1")) for k, v in reply.headers.items()]
        if secure:
            headers += self.https_headers
        if reply.stream is None:
            headers.append((b"content-length", str(len(reply.body)).encode()))
            await send({"type": "http.response.start", "status": reply.status, "headers": headers})
            await send({"type": "http.response.body", "body": reply.body})
            return
        stream = reply.stream
        try:
            await send({"type": "http.response.start", "status": reply.status, "headers": headers})
            async for part in stream:
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            # Cancelled while sending: the relay is suspended and must end (and abort).
            await stream.aclose()


async def _disconnected(receive: Receive) -> None:
    """Return when the client disconnects (the body has been read by then)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def gateway_lifespan(scope: Scope, receive: Receive, send: Send) -> None:
    """The ASGI lifespan protocol: at startup, the replay of records an earlier process
    spooled; at shutdown (after the server's last request), ``close_upstream`` on the
    serving loop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            records.start()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            try:
                await close_upstream()
            except Exception as e:  # still report the shutdown: the server is stopping
                log.exception("closing the gateway's connections failed")
                await send({"type": "lifespan.shutdown.failed", "message": repr(e)})
                return
            await send({"type": "lifespan.shutdown.complete"})
            return


def gateway_fast_path(app: ASGIApp) -> ASGIApp:
    """``app`` with the gateway's routes served by the fast path."""
    return GatewayFastPath(app)
