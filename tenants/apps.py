from django.apps import AppConfig


class TenantsConfig(AppConfig):
    """Tenants, their API keys, quotas and usage records."""

    name = "shunter.tenants"
    label = "tenants"
    verbose_name = "Tenants"
    default_auto_field = "django.db.models.BigAutoField"
