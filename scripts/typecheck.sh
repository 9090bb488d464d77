#!/usr/bin/env bash
# mypy over the shunter namespace. mypy does not follow the editable install's import
# hook, so link each folder into var/typecheck/shunter/ where module names match.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
tree=var/typecheck/shunter
mkdir -p "$tree"
packages=(engine kernels common platform tenants benchmarks console gateway project)
args=()
for pkg in "${packages[@]}"; do
  ln -sfn "../../../$pkg" "$tree/$pkg"
  args+=(-p "shunter.$pkg")
done
"$VENV/bin/mypy" "${args[@]}"
