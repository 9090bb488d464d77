"""Settings come from the environment; each case loads them in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from shunter.project.settings import database_from_url, env_bool, env_log_level, env_number
from tests.conftest import REPO, VENV_BIN, Process, free_port

PROBE = (
    "import json, shunter.project.settings as s;"
    "print(json.dumps({'db': s.DATABASES['default']['ENGINE'],"
    " 'layer': s.CHANNEL_LAYERS['default']['BACKEND'], 'cache': s.CACHES['default']['BACKEND'],"
    " 'eager': s.CELERY_TASK_ALWAYS_EAGER, 'broker': s.CELERY_BROKER_URL,"
    " 'key': s.SECRET_KEY, 'debug': s.DEBUG, 'hsts': s.SECURE_HSTS_SECONDS}))"
)


def load_settings(env: dict[str, str]) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    loaded: dict[str, object] = json.loads(result.stdout)
    return loaded


def test_embedded_default_uses_sqlite_in_memory_layer_and_eager_tasks(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    loaded = load_settings(clean_env)
    assert loaded["db"] == "django.db.backends.sqlite3"
    assert loaded["layer"] == "channels.layers.InMemoryChannelLayer"
    assert loaded["cache"].endswith("LocMemCache")  # type: ignore[union-attr]
    assert loaded["eager"] is True
    assert loaded["broker"] == "memory://localhost//"
    # The generated key is kept and reused.
    key_file = tmp_path / "var" / "secret_key"
    assert key_file.read_text() == loaded["key"]
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert load_settings(clean_env)["key"] == loaded["key"]


def test_redis_url_switches_channels_cache_and_celery(clean_env: dict[str, str]) -> None:
    env = {
        **clean_env,
        "REDIS_URL": "redis://127.0.0.1:6379/3",
        "DATABASE_URL": "postgres://u:p@db.example:5433/shunter",
    }
    loaded = load_settings(env)
    assert loaded["db"] == "django.db.backends.postgresql"
    assert loaded["layer"] == "channels_redis.core.RedisChannelLayer"
    assert loaded["cache"] == "django.core.cache.backends.redis.RedisCache"
    assert loaded["eager"] is False
    assert loaded["broker"] == "redis://127.0.0.1:6379/3"


def test_production_defaults_turn_on_https_hardening(clean_env: dict[str, str]) -> None:
    loaded = load_settings({**clean_env, "DEBUG": "0", "SECRET_KEY": "x" * 60})
    assert loaded["debug"] is False
    assert loaded["key"] == "x" * 60
    assert loaded["hsts"] == 31536000
    assert load_settings({**clean_env, "DEBUG": "1"})["hsts"] == 0


def test_database_url_postgres_parts() -> None:
    db = database_from_url("postgres://alice:s%40cret@10.0.0.5:6543/shunter_prod")
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == (
        "alice",
        "s@cret",
        "10.0.0.5",
        "6543",
        "shunter_prod",
    )


def test_database_url_sqlite_absolute_and_relative() -> None:
    assert database_from_url("sqlite:////srv/db.sqlite3")["NAME"] == "/srv/db.sqlite3"
    assert database_from_url("sqlite:///var/db.sqlite3")["NAME"] == "var/db.sqlite3"


@pytest.mark.parametrize("url", ["mysql://h/db", "postgres://h/", "sqlite://"])
def test_database_url_rejects_what_it_cannot_serve(url: str) -> None:
    with pytest.raises(ImproperlyConfigured):
        database_from_url(url)


def test_env_bool_rejects_garbage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHUNTER_FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="SHUNTER_FLAG"):
        env_bool("SHUNTER_FLAG", False)
    monkeypatch.setenv("SHUNTER_FLAG", "off")
    assert env_bool("SHUNTER_FLAG", True) is False


@pytest.mark.parametrize(
    ("raw", "integer", "says"),
    [
        ("abc", True, "is not an integer"),
        ("1.5", True, "is not an integer"),
        ("0", True, "of at least 1"),
        ("nan", False, "of at least 1"),
        ("inf", False, "of at least 1"),
    ],
)
def test_env_number_names_the_variable_and_what_it_expects(
    monkeypatch: pytest.MonkeyPatch, raw: str, integer: bool, says: str
) -> None:
    monkeypatch.setenv("SHUNTER_N", raw)
    with pytest.raises(ImproperlyConfigured, match=f"SHUNTER_N='{raw}'.*{says}"):
        env_number("SHUNTER_N", 3, least=1, integer=integer)


def test_env_number_and_log_level_take_what_they_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHUNTER_N", raising=False)
    assert env_number("SHUNTER_N", 3, least=1, integer=True) == 3
    monkeypatch.setenv("SHUNTER_N", "")
    assert env_number("SHUNTER_N", 3, least=1, integer=True) == 3
    monkeypatch.setenv("SHUNTER_N", "2.5")
    assert env_number("SHUNTER_N", 3.0, least=0) == 2.5
    monkeypatch.setenv("SHUNTER_LEVEL", "debug")
    assert env_log_level("SHUNTER_LEVEL", "INFO") == "DEBUG"
    monkeypatch.setenv("SHUNTER_LEVEL", "LOUD")
    with pytest.raises(ImproperlyConfigured, match="SHUNTER_LEVEL='LOUD' is not a log level"):
        env_log_level("SHUNTER_LEVEL", "INFO")


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("DATABASE_URL", "garbage", "DATABASE_URL scheme '' is not supported"),
        ("SHUNTER_LOG_LEVEL", "LOUD", "is not a log level"),
        ("SHUNTER_NODE_POLL_MISSES", "0", "expected an integer of at least 1"),
        ("REDIS_URL", "127.0.0.1:6379", "REDIS_URL scheme '' is not supported"),
    ],
)
def test_a_bad_setting_is_one_line_from_the_command_not_a_traceback(
    clean_env: dict[str, str], variable: str, value: str, says: str
) -> None:
    run = subprocess.run(
        [str(VENV_BIN / "shunter"), "manage", "check"],
        env={**clean_env, variable: value},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    [line] = run.stderr.strip().splitlines()
    assert line.startswith("shunter manage: configuration error: ") and says in line


def test_database_connections_give_up_after_a_connect_timeout() -> None:
    assert database_from_url("postgres://db/shunter")["OPTIONS"] == {"connect_timeout": 3}
    db = database_from_url("postgres://db/shunter?connect_timeout=10")
    assert db["OPTIONS"] == {"connect_timeout": 10}
    with pytest.raises(ImproperlyConfigured, match="connect_timeout"):
        database_from_url("postgres://db/shunter?connect_timeout=0")


@pytest.mark.slow
def test_a_web_process_logs_each_event_once_and_no_traceback_for_a_bad_host(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "web.log"
    web = Process(
        [str(VENV_BIN / "shunter"), "web", "--port", str(port)], {**clean_env, "DEBUG": "1"}, log
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while not _get(url + "/console/login/"):
            assert web.proc.poll() is None and time.monotonic() < deadline, web.output()
            time.sleep(0.3)
        assert _get(url + "/static/console/console.css") == 200
        assert _get(url + "/no-such-page") == 404
        assert _get(url + "/console/login/", {"Host": "evil.example"}) == 400
        time.sleep(0.5)
    finally:
        web.stop()
    text = log.read_text()
    assert text.count("Not Found: /no-such-page") == 1
    assert text.count("Invalid HTTP_HOST header") == 1 and "Traceback" not in text
    assert "StreamingHttpResponse" not in text


def _get(url: str, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0
