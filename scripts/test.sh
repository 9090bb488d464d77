#!/usr/bin/env bash
# The README's test command: lint, type check, then the whole suite against real
# PostgreSQL and Redis.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/shunter}
export REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
export SHUNTER_VAR_DIR=${SHUNTER_VAR_DIR:-$PWD/var/test}

"$VENV/bin/python" scripts/check_services.py
echo "== ruff"
"$VENV/bin/ruff" check .
echo "== mypy"
bash scripts/typecheck.sh
echo "== pytest"
"$VENV/bin/pytest" "$@"
