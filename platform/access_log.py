"""The web server's logs without secrets from URLs: clients put keys in query strings
(``?api_key=sk-...``), and uvicorn logs each request's path with its query. Every query
value in uvicorn's access and websocket lines is written as ``REDACTED``; the parameter
names stay, so an operator still sees what was asked."""

from __future__ import annotations

import copy
import logging
from typing import Any, TypeGuard

REDACTED = "REDACTED"


def redact_query(path: str) -> str:
    """``path`` with every query value redacted: ``/v1/models?api_key=REDACTED&x=REDACTED``;
    a parameter without a value is redacted whole (it may be a bare secret)."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    items = []
    for item in query.split("&"):
        name, eq, _ = item.partition("=")
        items.append(f"{name}={REDACTED}" if eq else REDACTED)
    return f"{base}?{'&'.join(items)}"


class RedactQuery(logging.Filter):
    """Redacts the query values of the paths in a uvicorn record's arguments (uvicorn
    passes the path, with its query, as one argument of the access and websocket
    lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(map(_is_path, record.args)):
            record.args = tuple(redact_query(a) if _is_path(a) else a for a in record.args)
        return True


def _is_path(arg: object) -> TypeGuard[str]:
    return isinstance(arg, str) and arg.startswith("/") and "?" in arg


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's own logging configuration with ``RedactQuery`` on both its handlers."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact_query"] = {"()": RedactQuery}
    for handler in config["handlers"].values():
        handler.setdefault("filters", []).append("redact_query")
    return config
