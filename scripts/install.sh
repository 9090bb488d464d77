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

# The console's browser test drives the system Chromium (Debian's package, never a
# downloaded browser); install it when missing and this user may. Without it that
# test skips and says why.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "installing Debian's chromium and chromium-driver for the browser tests"
  { apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; }; } ||
    echo "chromium could not be installed: the browser tests will skip"
fi

stamp="$VENV/.shunter-installed"
if [ -f "$stamp" ] && cmp -s pyproject.toml "$stamp" && "$VENV/bin/python" -c "import shunter.engine" 2>/dev/null; then
  exit 0
fi
# One line per step, with its time: a first install takes a minute or two.
step() {
  local label=$1 start=$SECONDS
  shift
  echo "install: $label ..."
  "$@"
  echo "install: $label done in $((SECONDS - start)) s"
}
step "[1/2] torch==2.13.0 (the CPU build)" "$VENV/bin/pip" install --quiet "torch==2.13.0"
# setuptools warns, on every editable install, that folders at the repository root
# (platform/, project/, ...) share names with the package's parts: that is this layout
# by design (package-dir maps them; tests/project/test_packaging.py holds it).
step "[2/2] shunter[dev], editable, and its dependencies" \
  env PYTHONWARNINGS="ignore:Editable installation" "$VENV/bin/pip" install --quiet -e ".[dev]"
cp pyproject.toml "$stamp"
