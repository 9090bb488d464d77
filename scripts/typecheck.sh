#!/usr/bin/env bash
# mypy over the shunter namespace. mypy does not follow the editable install's import
# hook, so link each folder into var/typecheck/shunter/ where module names match.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
tree=var/typecheck/shunter
mkdir -p "$tree"
for pkg in engine kernels platform tenants console; do
  ln -sfn "../../../$pkg" "$tree/$pkg"
done
"$VENV/bin/mypy" -p shunter.engine -p shunter.kernels -p shunter.platform -p shunter.tenants -p shunter.console
