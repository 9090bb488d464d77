"""``shunter bench gateway`` runs end to end on a tiny workload and prints its ratios: by
default with the gateway on PostgreSQL and Redis, with ``--embedded`` on SQLite."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg
import pytest
import redis

from shunter.engine.benchfigure import read_figures
from tests.conftest import REPO, VENV_BIN

pytestmark = pytest.mark.slow

DATABASE_URL = os.environ.get("DATABASE_URL", "")
REDIS_URL = os.environ.get("REDIS_URL", "")
TINY = ["--streams", "2", "--requests", "2", "--prompt-tokens", "8", "--max-tokens", "4"]


def bench_gateway(env: dict[str, str], *args: str) -> list[str]:
    """The report lines of ``shunter bench gateway`` on a tiny workload, one round."""
    command = [str(VENV_BIN / "shunter"), "bench", "gateway", *TINY, "--rounds", "1", *args]
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip().splitlines()


def assert_ratios(lines: list[str]) -> None:
    rows = [line.split() for line in lines[3:6]]
    assert [r[0] for r in rows] == ["engine", "gateway", "ratio"]
    assert all(float(v) > 0 for r in rows[:2] for v in r[1:])
    assert rows[2][1].endswith("x") and rows[2][2].endswith("x")
    assert lines[6].startswith("gateway/engine: TTFT ratio ")
    assert "(target <= 1.10x)" in lines[6] and "added median ITL" in lines[6]


def quota_keys(client: redis.Redis) -> set[bytes]:
    return set(client.scan_iter(match="shunter:quota:*"))


def test_bench_gateway_measures_the_gateway_on_postgresql_and_redis(tmp_path: Path) -> None:
    if not (DATABASE_URL and REDIS_URL):
        pytest.skip("DATABASE_URL and REDIS_URL are not set (make test sets them)")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(SHUNTER_VAR_DIR=str(tmp_path / "var"), PYTHONUNBUFFERED="1")
    throwaway = DATABASE_URL.rsplit("/", 1)[1] + "_bench_gateway"
    keys_before = quota_keys(redis.Redis.from_url(REDIS_URL))

    lines = bench_gateway(env, "--json", str(tmp_path / "figures.json"))

    assert lines[0].startswith(f"gateway on the production path: PostgreSQL (database {throwaway},")
    # What the running gateway itself reported: both answered.
    assert lines[0].endswith("its /healthz: database postgresql, redis ok")
    assert_ratios(lines)
    figures = {f.name: f for f in read_figures(tmp_path / "figures.json")}
    assert {name: (f.target, f.direction) for name, f in figures.items()} == {
        "gateway.ttft_ratio": (1.10, "<="),
        "gateway.added_itl_ms": (1.0, "<="),
    }
    assert lines[6].startswith(
        f"gateway/engine: TTFT ratio {figures['gateway.ttft_ratio'].value:.2f}x"
    )
    # The run cleans up after itself: its database is dropped, its quota counts deleted.
    maintenance = DATABASE_URL.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(maintenance) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (throwaway,))
        assert found.fetchone() is None
    assert quota_keys(redis.Redis.from_url(REDIS_URL)) <= keys_before


def test_bench_gateway_embedded_measures_the_gateway_on_sqlite(
    clean_env: dict[str, str],
) -> None:
    lines = bench_gateway(clean_env, "--embedded")
    assert lines[0] == (
        "gateway on the embedded path (--embedded): SQLite, in-process quotas; "
        "its /healthz: database sqlite, redis not used"
    )
    assert_ratios(lines)


def test_bench_gateway_without_postgresql_says_so(clean_env: dict[str, str]) -> None:
    env = {**clean_env, "DATABASE_URL": "sqlite:///nowhere.sqlite3"}
    command = [str(VENV_BIN / "shunter"), "bench", "gateway"]
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == (
        "shunter bench gateway: the production path needs PostgreSQL, and DATABASE_URL is "
        "sqlite:// (use --embedded for SQLite)\n"
    )


def test_bench_gateway_with_replicas_kills_one_under_load_and_reports_both_phases(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    command = [str(VENV_BIN / "shunter"), "bench", "gateway", "--replicas", "2", "--embedded"]
    command += ["--duration", "3", "--clients", "2", "--prompt-tokens", "8", "--max-tokens", "4"]
    command += ["--json", str(tmp_path / "figures.json")]
    run = subprocess.run(
        command, cwd=REPO, env=clean_env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert lines[1].startswith("tiny-llama on cpu on 2 engines (nodes)")
    phases = {line.split("  ")[0]: line.split()[2:] for line in lines[3:5]}
    assert set(phases) == {"none killed", "one killed"}
    for requests, served, failed, broken, p50, p99 in phases.values():
        assert int(requests) == int(served) + int(failed) + int(broken) > 0
        assert 0 < float(p50) <= float(p99)
    assert lines[-1].startswith("one of 2 replicas killed at 1.5 s: P99 TTFT ")
    (figure,) = read_figures(tmp_path / "figures.json")
    assert (figure.name, figure.target, figure.direction) == (
        "gateway.failover_new_served",
        1.0,
        ">=",
    )
    assert 0.0 <= figure.value <= 1.0
