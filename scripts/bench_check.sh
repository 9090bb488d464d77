#!/usr/bin/env bash
# `make bench-check`: the benchmarks of `make bench`, each figure held to the target it
# prints within a stated noise margin (engine/benchcheck.py); exit 1 on a miss. The
# gateway's runs on PostgreSQL and Redis ($DATABASE_URL, $REDIS_URL, else local defaults).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${VENV:-.venv}/bin/shunter" bench check "$@"
