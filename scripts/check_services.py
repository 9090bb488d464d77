"""Stop at once, saying which and how to start it, if PostgreSQL or Redis is unreachable;
create DATABASE_URL's database when the server lacks it."""

from __future__ import annotations

import os
import sys

import psycopg
import redis
from psycopg import sql

HINT = "start it with `docker compose up -d postgres redis`, or see docs/operations.md"


def main() -> int:
    database_url = os.environ["DATABASE_URL"]
    redis_url = os.environ["REDIS_URL"]
    failures = []
    server_url, name = database_url.rsplit("/", 1)
    try:
        # Connect to the maintenance database: the test run creates its own, and the
        # processes its tests start (a worker, a web server) connect to DATABASE_URL's,
        # which a fresh server does not have yet.
        with psycopg.connect(server_url + "/postgres", connect_timeout=3, autocommit=True) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if found.fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        failures.append(f"PostgreSQL is unreachable at {database_url}: {exc}".strip())
    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        failures.append(f"Redis is unreachable at {redis_url}: {exc}")
    for failure in failures:
        print(f"error: {failure}\n  {HINT}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
