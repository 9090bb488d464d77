"""Benchmark jobs and runs, a Django app: the services (``services``: import from there),
their Celery tasks, admin and REST API. The job and run models are the platform app's."""
