#!/usr/bin/env bash
# The README's demo command: the whole platform (engine, web, load generator) on the
# embedded default, served until Ctrl-C (see docs/operations.md, "Demo").
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
# The embedded default: no DATABASE_URL (SQLite under var/), no REDIS_URL (in-memory).
unset DATABASE_URL REDIS_URL
exec "$VENV/bin/shunter" demo --host "${SHUNTER_DEMO_HOST:-127.0.0.1}" --port "${SHUNTER_DEMO_PORT:-8000}"
