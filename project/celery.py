"""The Celery application. Without REDIS_URL tasks run in-process (eagerly).

Benchmark runs go to the ``benchmarks`` queue (``CELERY_TASK_ROUTES``), everything else
(node polls and reconciles, beat's entries) to the default one, so that a long load test
never holds up a poll: production runs a worker for each (docker-compose.yml).

Beat's schedule lives in the database (django-celery-beat); the entries below are
written there when beat starts, and an operator can change their interval in the admin.
"""

from __future__ import annotations

import os
import sys

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shunter.project.settings")

_path = list(sys.path)
app = Celery("shunter")
# Celery's Django fixup puts the working directory first on sys.path, for projects
# imported from there. Shunter is an installed package; run from a checkout, the
# checkout's folders (kernels, engine, platform, ...) would shadow installed modules of
# those names: transformers 5.25 imports Hugging Face's ``kernels`` and got ours.
if sys.path[1:] == _path and sys.path[0] == os.getcwd():
    del sys.path[0]
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.beat_schedule = {
    # Engine health, state (for the console) and restart detection, every few seconds.
    "shunter-nodes-poll": {
        "task": "shunter.platform.nodes_poll",
        "schedule": 5.0,
        "options": {"expires": 5.0},
    },
    # Benchmark runs whose worker stopped end failed instead of blocking their job.
    "shunter-benchmark-runs-reap": {
        "task": "shunter.platform.benchmark_runs_reap",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
}
app.autodiscover_tasks()
