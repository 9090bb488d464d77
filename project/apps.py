from pathlib import Path

from django.apps import AppConfig


class ProjectConfig(AppConfig):
    """The Django project as an app: its management commands (``seed_demo``)."""

    name = "shunter.project"
    label = "project"
    verbose_name = "Shunter"
    path = str(Path(__file__).resolve().parent)
