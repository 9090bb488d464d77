"""A server on a loopback port with its own event loop in a thread of this process:
for tests and benchmarks that drive it with real HTTP clients."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from aiohttp import web

from shunter.engine.api.jsonbody import MAX_BODY_BYTES
from shunter.engine.server.app import build_app
from shunter.engine.server.context import ServerState

T = TypeVar("T")


class BackgroundServer:
    """Serves ``state`` on ``127.0.0.1`` at ``url`` until :meth:`close`."""

    def __init__(self, state: ServerState, *, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.state = state
        self.loop = asyncio.new_event_loop()
        app = build_app(state, max_body_bytes=max_body_bytes)
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.loop.run_until_complete(web.SockSite(self.runner, sock).start())
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run ``coro`` on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)

    def close(self) -> None:
        self.run(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
