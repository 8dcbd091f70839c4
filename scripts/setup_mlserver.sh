#!/usr/bin/env bash
# MLServer 1.7.1 in a virtualenv of its own, for tests/test_serving_mlserver.py: its FastAPI and
# Starlette pins conflict with KServe's, so it cannot share the package's environment. Idempotent:
# a second run only checks. The virtualenv's interpreter is where alma_daemon/local_servers/mlserver.py
# looks (ALMA_MLSERVER_PYTHON, default .venvs/mlserver/bin/python in this checkout); the folder is that one's.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)

python_path="${ALMA_MLSERVER_PYTHON:-$PWD/.venvs/mlserver/bin/python}"
venv="$(dirname "$(dirname "$python_path")")"

ready() {
  [ -x "$python_path" ] && "$python_path" -c "
import mlserver, torch, serving.mlserver_runtime
assert mlserver.__version__ == '1.7.1' and torch.__version__.startswith('2.13.0'), (mlserver.__version__, torch.__version__)
" 2>/dev/null
}

if ! ready; then
  [ -x "$python_path" ] || python3 -m venv "$venv"
  # torch is pinned to the local CPU wheel (as in pyproject.toml): no CUDA packages.
  "$python_path" -m pip install --quiet torch==2.13.0 mlserver==1.7.1
  # alma-daemon from this checkout, for its dependencies (the server puts the checkout first on its path).
  "$python_path" -m pip install --quiet -e .
  ready || { echo "MLServer's virtualenv in $venv does not import mlserver 1.7.1 and serving.mlserver_runtime" >&2; exit 1; }
fi
echo "MLServer's virtualenv ready in $venv ($(( $(date +%s) - started )) s)"
