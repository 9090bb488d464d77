"""How the web process speaks HTTP/1.1 (``shunter web``, ``shunter demo``): uvicorn's
httptools protocol with the request head bounded and the server's own refusals, those
that never reach the ASGI application, in OpenAI's error format.

httptools keeps no limit on a request's line and headers: it buffers a header of any
size before the application sees it. Here a head past ``MAX_HEAD_BYTES`` is refused
with 431 as soon as that many bytes have arrived, and the connection closed. A request
the parser cannot read (an unknown method, a malformed line or header) is a 400.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from shunter.engine.api.errors import ApiError

MAX_HEAD_BYTES = 64 * 1024
"""The request line and headers together, in bytes (a bearer key takes about 60)."""


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's ``HttpToolsProtocol``, the request head at most ``MAX_HEAD_BYTES``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_bytes: int | None = 0  # bytes of the head so far; None past the head

    def data_received(self, data: bytes) -> None:
        if self.head_bytes is None:
            super().data_received(data)
            return
        room = MAX_HEAD_BYTES - self.head_bytes
        self.head_bytes += len(data)
        if len(data) <= room:
            super().data_received(data)
            return
        # Only the head's allowance goes to the parser: the rest is body, or too much.
        super().data_received(data[:room])
        if self.transport.is_closing():
            return
        if self.head_bytes is not None:
            message = f"The request line and headers exceed {MAX_HEAD_BYTES} bytes."
            self.send_error(ApiError(431, message, code="request_header_fields_too_large"))
            return
        super().data_received(data[room:])

    def on_headers_complete(self) -> None:
        self.head_bytes = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.head_bytes = 0

    def send_400_response(self, msg: str) -> None:
        """The parser's refusal (``msg`` is uvicorn's generic one), in OpenAI's format."""
        self.send_error(
            ApiError(
                400,
                "The request is not valid HTTP/1.1: its method, request line or a header "
                "cannot be read.",
                code="invalid_http_request",
            )
        )

    def send_error(self, error: ApiError) -> None:
        """Answer ``error`` as an OpenAI error body and close the connection."""
        body = json.dumps(error.body()).encode()
        head = [f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}\r\n".encode()]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()
