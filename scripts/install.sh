#!/usr/bin/env bash
# Create the virtual environment if missing and install the project with its dev extra.
# torch==2.13.0 goes first: it is the CPU build shipped with the machine image, and a
# looser requirement would pull a CUDA build from the registry. Idempotent and quick
# when nothing changed (a stamp records the pyproject.toml that was installed).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
fi

stamp="$VENV/.shunter-installed"
if [ -f "$stamp" ] && cmp -s pyproject.toml "$stamp" && "$VENV/bin/python" -c "import shunter.engine" 2>/dev/null; then
  exit 0
fi
echo "installing torch==2.13.0, then shunter[dev] (editable)"
"$VENV/bin/pip" install --quiet "torch==2.13.0"
"$VENV/bin/pip" install --quiet -e ".[dev]"
cp pyproject.toml "$stamp"
