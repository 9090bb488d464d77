"""The Celery application. Without REDIS_URL tasks run in-process (eagerly)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shunter.platform.settings")

app = Celery("shunter")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
