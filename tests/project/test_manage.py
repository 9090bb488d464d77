"""Django's own checks through `shunter manage`, as an operator runs them."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import REPO, VENV_BIN

pytestmark = pytest.mark.slow


def shunter(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "shunter"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_no_missing_migrations(clean_env: dict[str, str]) -> None:
    result = shunter("manage", "makemigrations", "--check", "--dry-run", env=clean_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No changes detected" in result.stdout


def test_deploy_check_has_no_warnings_with_production_variables(
    clean_env: dict[str, str],
) -> None:
    env = {
        **clean_env,
        "DEBUG": "0",
        "SECRET_KEY": "k3y-" + "9f2e7c1a" * 7,
        "ALLOWED_HOSTS": "shunter.example.com",
        "DATABASE_URL": os.environ.get(
            "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/shunter"
        ),
    }
    result = shunter("manage", "check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_deploy_check_flags_debug(clean_env: dict[str, str]) -> None:
    env = {**clean_env, "DEBUG": "1", "SECRET_KEY": "k3y-" + "9f2e7c1a" * 7}
    result = shunter("manage", "check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode != 0
    assert "security.W018" in result.stdout + result.stderr


def test_help_lists_every_subcommand(clean_env: dict[str, str]) -> None:
    result = shunter("--help", env=clean_env)
    assert result.returncode == 0
    for name in ("manage", "web", "worker", "beat", "demo"):
        assert f"    {name}" in result.stdout
