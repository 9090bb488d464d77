from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The live admin console: SLO attainment, node memory maps, benchmarks."""

    name = "shunter.console"
    label = "console"
    verbose_name = "Console"
    default_auto_field = "django.db.models.BigAutoField"
