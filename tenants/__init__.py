"""Tenants, API keys, quotas and usage records (Django app ``tenants``)."""
