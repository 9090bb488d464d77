"""The ASGI application: Django for HTTP (the gateway's routes on its fast path),
Channels for websockets, and the lifespan protocol (the gateway's connections close at
shutdown). Servers run it with lifespan on (``shunter web``, ``shunter demo``)."""

from __future__ import annotations

import os
import warnings

from django.core.asgi import get_asgi_application

# WhiteNoise answers static files with a file iterator, which Django's ASGI handler reads
# in a worker thread (what the warning is about) on every page's CSS and scripts. They
# are a few kilobytes, cached by browsers, and the gateway's streams do not go this way.
warnings.filterwarnings(
    "ignore", message="StreamingHttpResponse must consume synchronous iterators"
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shunter.project.settings")
# Django must be set up before anything imports models (the websocket routes do).
django_http = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from shunter.gateway.asgi import gateway_fast_path, gateway_lifespan  # noqa: E402
from shunter.project.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": gateway_fast_path(django_http),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
        "lifespan": gateway_lifespan,
    }
)
