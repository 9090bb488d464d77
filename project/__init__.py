"""The Django project: settings, root URLs, the ASGI application, the Celery application,
the ``shunter`` command line and the demo. It wires the apps together; no app imports it.

The Celery application is loaded with the project, so that every app's ``shared_task``
runs on it (Django settings, the broker from REDIS_URL, eager without one)."""

from shunter.project.celery import app as celery_app

__all__ = ["celery_app"]
