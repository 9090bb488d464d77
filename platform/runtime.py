"""What the running platform is wired to, read from the settings (for pages and the CLI)."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import connection


@dataclass(frozen=True)
class Runtime:
    database: str
    channel_layer: str
    task_mode: str
    embedded: bool


def describe() -> Runtime:
    """Summarise the database, channel layer and Celery mode in use."""
    backend = str(settings.CHANNEL_LAYERS["default"]["BACKEND"])
    layer = backend.rsplit(".", 1)[-1]
    redis = bool(settings.REDIS_URL)
    return Runtime(
        database=connection.vendor,
        channel_layer=layer,
        task_mode="Redis broker" if redis else "in-process",
        embedded=connection.vendor == "sqlite" and not redis,
    )
