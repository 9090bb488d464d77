"""A small synchronous client of an engine's control routes, with short timeouts.

Celery tasks and services call it; every failure (unreachable, timeout, an error
status, a body that is not JSON) is an ``EngineError`` whose message says what happened.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

DEFAULT_TIMEOUT_S = 2.0
# Rebuilding an engine's models (a PUT that adds or reloads one) loads weights: it gets
# longer than a probe.
RECONCILE_TIMEOUT_S = 120.0


class EngineError(Exception):
    """A call to an engine failed; ``status`` is its HTTP status when it answered;
    ``refused`` is True when nothing listened at its address (the connection was
    refused), as opposed to an engine slow to answer."""

    def __init__(self, message: str, *, status: int | None = None, refused: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.refused = refused


@dataclass(frozen=True)
class EngineClient:
    """The engine at ``base_url``; ``token`` (may be '') is its bearer token."""

    base_url: str
    token: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S

    def health(self) -> dict[str, Any]:
        """``GET /health`` (no auth): ``{"status": "ok"}``; EngineError when draining."""
        return self._call("GET", "/health")

    def state(self) -> dict[str, Any]:
        """``GET /admin/state``: models, arena pages by owner, transfers, steps."""
        return self._call("GET", "/admin/state")

    def models(self) -> dict[str, Any]:
        """``GET /v1/models``: the served models; ``created`` is the engine's start time."""
        return self._call("GET", "/v1/models")

    def put_deployments(self, body: dict[str, Any]) -> dict[str, Any]:
        """``PUT /admin/deployments``: what the engine added, removed, reloaded."""
        return self._call("PUT", "/admin/deployments", body, timeout_s=RECONCILE_TIMEOUT_S)

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        url = self.base_url.rstrip("/") + path
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s) as reply:
                raw = reply.read()
        except urllib.error.HTTPError as e:
            raise EngineError(
                f"{method} {path}: HTTP {e.code}: {_error_message(e.read())}", status=e.code
            ) from None
        # URLError and timeouts are OSErrors; a connection cut mid-reply is neither.
        except (OSError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", e)
            raise EngineError(
                f"{method} {path}: engine unreachable: {reason}",
                refused=isinstance(reason, ConnectionRefusedError),
            ) from None
        try:
            parsed = json.loads(raw)
        except ValueError:
            raise EngineError(f"{method} {path}: the reply is not JSON") from None
        if not isinstance(parsed, dict):
            raise EngineError(f"{method} {path}: the reply is not a JSON object")
        return parsed


def _error_message(raw: bytes) -> str:
    """The message of an OpenAI-format error body, else the body's start."""
    try:
        body = json.loads(raw)
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return raw[:200].decode(errors="replace") or "(empty body)"
