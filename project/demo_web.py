"""The demo's web server: the ASGI application served as ``shunter web`` serves it, with
a hook for the first stop signal, and the URL this machine reaches it at."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from types import FrameType

# Seconds the web server gives open connections to finish on shutdown.
GRACEFUL_SHUTDOWN_S = 5


def serve(host: str, port: int, *, on_exit: Callable[[], None]) -> None:
    """Serve the ASGI application (as ``shunter web``) until SIGINT or SIGTERM, calling
    ``on_exit`` once when the first arrives, before the server stops accepting. Returns
    normally on either signal (exit status 0)."""
    import uvicorn

    from shunter.gateway.server import GatewayHttpProtocol

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.should_exit:
                on_exit()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        "shunter.project.asgi:application",
        host=host,
        port=port,
        http=GatewayHttpProtocol,  # as ``shunter web``
        proxy_headers=True,
        forwarded_allow_ips=os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1"),
        lifespan="on",  # the gateway closes its connections at shutdown
        # The console shows the traffic; a line per load-generator request would bury
        # the demo's own messages.
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    # uvicorn raises the signal it stopped on again once it is done; these handlers
    # receive it, so the demo goes on to stop its children and exits 0.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        Server(config).run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def local_url(host: str, port: int) -> str:
    """The URL this machine reaches the server at (a wildcard bind through loopback)."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"
