"""The one settings module of the Shunter control plane.

Everything that differs between the embedded default (``make demo``) and a
production deployment comes from environment variables:

- ``DATABASE_URL``: ``postgres://user:pass@host:port/name`` or ``sqlite:///path``.
  Absent: an SQLite file under the var directory (the embedded default).
- ``REDIS_URL``: absent, the Channels layer is in-memory, the cache is local
  and Celery runs tasks in-process; present, channels-redis, the Redis cache
  and the Redis broker are used.
- ``SECRET_KEY``: absent, a random key is generated once and kept in
  ``<var>/secret_key``.
- ``DEBUG`` (default ``0``), ``ALLOWED_HOSTS`` (comma-separated),
  ``CSRF_TRUSTED_ORIGINS`` (comma-separated).
- ``SHUNTER_VAR_DIR`` (default ``./var``), ``SHUNTER_HTTPS`` (default: not
  DEBUG; secure cookies, HTTPS redirect and HSTS), ``SHUNTER_LOG_LEVEL``.
- ``SHUNTER_GATEWAY_READ_TIMEOUT_S`` (default 600): how long the gateway waits for an
  engine's whole non-streamed answer before a 504 ``engine_unavailable``.
- ``SHUNTER_NODE_DRAIN_TIMEOUT_S`` (default 60): how long a change of a node's
  deployments waits, the node cordoned, for its requests in flight to finish.
- ``SHUNTER_MAX_SEQUENCES_PER_REQUEST`` (default 128, the engine's default): the most
  sequences (prompts x ``n``) one generation request may run; more is a 400 before
  admission.
- ``SHUNTER_SPOOL_DIR`` (default ``<var>/spool``): where the gateway keeps usage records
  while the database is unreachable, until it replays them (local disk; gateway
  processes of one host may share it).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured


def env_bool(name: str, default: bool) -> bool:
    """Read a boolean variable: 1/true/yes/on or 0/false/no/off."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1 or 0)")


def env_number(name: str, default: float, *, least: float, integer: bool = False) -> Any:
    """Read a number of at least ``least`` (an integer where ``integer``); unset or empty
    is ``default``. Anything else is a configuration error naming the variable."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    kind = "an integer" if integer else "a number"
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not {kind}") from None
    if not least <= value < float("inf"):
        raise ImproperlyConfigured(f"{name}={raw!r}: expected {kind} of at least {least:g}")
    return value


def env_log_level(name: str, default: str) -> str:
    """Read a logging level name (DEBUG, INFO, WARNING, ERROR, CRITICAL)."""
    raw = os.environ.get(name) or default
    level = raw.strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not a log level (DEBUG, INFO, WARNING, ERROR or CRITICAL)"
        )
    return level


def env_list(name: str, default: list[str]) -> list[str]:
    """Read a comma-separated list; blanks are dropped."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(url: str) -> dict[str, Any]:
    """Translate a ``DATABASE_URL`` into a Django ``DATABASES`` entry."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        # sqlite:///relative/path or sqlite:////absolute/path
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if not path:
            raise ImproperlyConfigured(f"DATABASE_URL {url!r} names no SQLite file")
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": path}
    if scheme in {"postgres", "postgresql", "pgsql"}:
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ImproperlyConfigured(f"DATABASE_URL {url!r} names no database")
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
            # A host that drops packets must not hold a request (or /healthz) for the
            # kernel's TCP timeout: the gateway refuses with 503 after this bound instead.
            "OPTIONS": {"connect_timeout": _connect_timeout(parts.query)},
        }
    raise ImproperlyConfigured(
        f"DATABASE_URL scheme {parts.scheme!r} is not supported (use postgres:// or sqlite://)"
    )


DB_CONNECT_TIMEOUT_S = 3


def _connect_timeout(query: str) -> int:
    """libpq's ``connect_timeout`` in seconds: the URL's ``?connect_timeout=`` if given,
    else ``DB_CONNECT_TIMEOUT_S``."""
    given = parse_qs(query).get("connect_timeout")
    if not given:
        return DB_CONNECT_TIMEOUT_S
    try:
        seconds = int(given[-1])
    except ValueError:
        raise ImproperlyConfigured(f"connect_timeout {given[-1]!r} is not whole seconds") from None
    if seconds < 1:
        raise ImproperlyConfigured("connect_timeout must be at least 1 second")
    return seconds


def secret_key(var_dir: Path) -> str:
    """The configured key, else one generated once and kept under the var directory."""
    configured = os.environ.get("SECRET_KEY", "")
    if configured:
        return configured
    path = var_dir / "secret_key"
    if path.exists():
        return path.read_text().strip()
    var_dir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    # Created with owner-only permissions; O_EXCL makes concurrent first starts safe.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(key)
    return key


BASE_DIR = Path(__file__).resolve().parent
VAR_DIR = Path(os.environ.get("SHUNTER_VAR_DIR", "var")).resolve()

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = secret_key(VAR_DIR)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "channels",
    "shunter.platform.apps.PlatformConfig",
    "shunter.tenants.apps.TenantsConfig",
    "shunter.benchmarks.apps.BenchmarksConfig",
    "shunter.console.apps.ConsoleConfig",
    "shunter.project.apps.ProjectConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "shunter.project.urls"
ASGI_APPLICATION = "shunter.project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": database_from_url(
        os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'shunter.sqlite3'}"
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Migrations live in the top-level migrations/ folder, one package per app.
MIGRATION_MODULES = {
    "platform": "shunter.migrations.platform",
    "tenants": "shunter.migrations.tenants",
    "console": "shunter.migrations.console",
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# After `collectstatic` (production images) static files carry hashed names from the
# manifest; the embedded default serves them straight from the apps via the finders.
STATIC_MANIFEST = env_bool("SHUNTER_STATIC_MANIFEST", (STATIC_ROOT / "staticfiles.json").exists())
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if STATIC_MANIFEST
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}
WHITENOISE_USE_FINDERS = not STATIC_MANIFEST
WHITENOISE_AUTOREFRESH = DEBUG

LOGIN_URL = "admin:login"
# Login throttling (shunter.platform.login_throttle), counted in the cache: this many
# failed logins within the window, per user name and per client address, refuse further
# logins for the cool-down, even with the right password.
LOGIN_FAILURE_LIMIT = env_number("SHUNTER_LOGIN_FAILURE_LIMIT", 5, least=1, integer=True)
LOGIN_FAILURE_WINDOW_S = env_number("SHUNTER_LOGIN_FAILURE_WINDOW_S", 900, least=1, integer=True)
LOGIN_COOLDOWN_S = env_number("SHUNTER_LOGIN_COOLDOWN_S", 900, least=0, integer=True)

# Consecutive node polls without an answer (a timeout, a connection cut) before the
# node is marked unhealthy: one slow answer does not take it out of routing. A refused
# connection or an error status marks it at once.
NODE_POLL_MISSES = env_number("SHUNTER_NODE_POLL_MISSES", 3, least=1, integer=True)

GATEWAY_READ_TIMEOUT_S = env_number("SHUNTER_GATEWAY_READ_TIMEOUT_S", 600.0, least=0.001)
# How long a drain-first change waits for a cordoned node's requests in flight to finish
# before it changes the node anyway.
NODE_DRAIN_TIMEOUT_S = env_number("SHUNTER_NODE_DRAIN_TIMEOUT_S", 60.0, least=0)
GATEWAY_MAX_SEQUENCES_PER_REQUEST = env_number(
    "SHUNTER_MAX_SEQUENCES_PER_REQUEST", 128, least=1, integer=True
)
GATEWAY_SPOOL_DIR = Path(os.environ.get("SHUNTER_SPOOL_DIR") or VAR_DIR / "spool").resolve()

REDIS_URL = os.environ.get("REDIS_URL", "")
_redis_scheme = urlsplit(REDIS_URL).scheme.lower()
if REDIS_URL and _redis_scheme not in ("redis", "rediss", "unix"):
    raise ImproperlyConfigured(
        f"REDIS_URL scheme {_redis_scheme!r} is not supported (use redis://, rediss:// or unix://)"
    )

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": "shunter:channels"},
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "shunter",
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Celery reads every CELERY_* setting (see shunter.project.celery).
# In-process tasks need no broker; the memory transport's URL names a host only so that
# kombu does not warn that none was supplied.
CELERY_BROKER_URL = REDIS_URL or "memory://localhost//"
CELERY_RESULT_BACKEND = REDIS_URL or "cache+memory://"
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = TIME_ZONE
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# Benchmark runs last minutes: a queue of their own, so polls never wait behind them
# (eager mode, without a broker, has no queues).
CELERY_TASK_ROUTES = {"shunter.platform.benchmark_run": {"queue": "benchmarks"}}
CELERY_BEAT_SCHEDULER = "shunter.platform.beat:LeaderScheduler"

# The admin REST API: staff by session (browser) or by token (scripts).
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "shunter.platform.api.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Shunter control plane API",
    "DESCRIPTION": "Nodes, models, deployments, SLO classes, tenants, API keys and usage.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The docs UI is served from the sidecar package: it works with no internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Production hardening: on unless DEBUG. Behind a TLS-terminating proxy the ASGI server
# takes the scheme from X-Forwarded-Proto of trusted peers (FORWARDED_ALLOW_IPS).
HTTPS = env_bool("SHUNTER_HTTPS", not DEBUG)
SECURE_SSL_REDIRECT = HTTPS
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_HSTS_SECONDS = (
    env_number("SHUNTER_HSTS_SECONDS", 31536000, least=0, integer=True) if HTTPS else 0
)
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
# The health probe is plain HTTP from inside the compose network.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"refused_host": {"()": "shunter.project.logfilters.RefusedHost"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_log_level("SHUNTER_LOG_LEVEL", "INFO")},
    "loggers": {
        # Django's own console handler (DEBUG) would print each of its records a second
        # time beside the root's: its records go to the root alone.
        "django": {"handlers": [], "propagate": True},
        "django.security.DisallowedHost": {"filters": ["refused_host"]},
    },
}
