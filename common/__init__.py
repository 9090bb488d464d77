"""Bases the control plane's apps share (platform, tenants, benchmarks): the tenant-scoped
queryset and the "in use" refusal (``db``), the service-backed admin (``admin``) and
API views (``api``). It imports none of the apps."""
