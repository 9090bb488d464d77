from pathlib import Path

from django.apps import AppConfig


class BenchmarksConfig(AppConfig):
    """Benchmark jobs and runs: their services, tasks, admin and API (the job and run
    models are the platform app's)."""

    name = "shunter.benchmarks"
    label = "benchmarks"
    verbose_name = "Benchmarks"
    path = str(Path(__file__).resolve().parent)
