from pathlib import Path

from django.apps import AppConfig


class PlatformConfig(AppConfig):
    """The control-plane app: nodes, models, deployments, SLO classes, the gateway."""

    name = "shunter.platform"
    label = "platform"
    verbose_name = "Platform"
    default_auto_field = "django.db.models.BigAutoField"
    # shunter.platform is a namespace package (see settings), whose __path__ may list
    # more than one entry; Django needs the one real folder.
    path = str(Path(__file__).resolve().parent)
