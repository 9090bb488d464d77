"""`make test` stops at once, naming the service, when PostgreSQL or Redis is down."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO, free_port


def check(database_url: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url}
    return subprocess.run(
        [sys.executable, "scripts/check_services.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_passes_when_both_answer() -> None:
    result = check(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/shunter"),
        os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    )
    assert result.returncode == 0, result.stderr


def test_names_each_unreachable_service_and_how_to_start_it() -> None:
    dead = free_port()
    result = check(f"postgres://postgres@127.0.0.1:{dead}/shunter", f"redis://127.0.0.1:{dead}/0")
    assert result.returncode == 1
    assert f"PostgreSQL is unreachable at postgres://postgres@127.0.0.1:{dead}/shunter" in (
        result.stderr
    )
    assert f"Redis is unreachable at redis://127.0.0.1:{dead}/0" in result.stderr
    assert result.stderr.count("docker compose up -d postgres redis") == 2
