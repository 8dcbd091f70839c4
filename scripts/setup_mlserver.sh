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
import mlserver, torch, serving.runtimes.mlserver
assert mlserver.__version__ == '1.7.1' and torch.__version__.startswith('2.13.0'), (mlserver.__version__, torch.__version__)
" 2>/dev/null
}

# --no-build-isolation where the interpreter has setuptools 77 or newer (pyproject.toml's build-system).
build_isolation() {
  "$python_path" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" 2>/dev/null &&
    echo --no-build-isolation
  return 0
}

if ! ready; then
  # --system-site-packages: what the package's own environment (scripts/setup.sh installs it first)
  # already has at versions MLServer accepts (torch, numpy, pandas, grpcio, pip, setuptools...) is used
  # from there, not installed again (1.2 GB: this script took 10 minutes on 2 cores, now about 1);
  # what MLServer pins otherwise (FastAPI, Starlette...) pip installs here, ahead of the shared one on
  # the path, and then lists the shared packages that pin otherwise (KServe): not used here.
  # --without-pip: that environment's pip runs here too (no ensurepip, no old pip to outdo).
  [ -x "$python_path" ] || python3 -m venv --system-site-packages --without-pip "$venv"
  "$python_path" -m pip --version >/dev/null 2>&1 || "$python_path" -m ensurepip --default-pip >/dev/null
  # torch is pinned to the local CPU wheel (as in pyproject.toml): no CUDA packages. alma-daemon from
  # this checkout, for its dependencies (the server puts the checkout first on its path), built with
  # the setuptools at hand where it is new enough (pyproject.toml's build-system) instead of
  # downloading one into an isolated build environment. One pip run: one resolution.
  "$python_path" -m pip install --quiet $(build_isolation) torch==2.13.0 mlserver==1.7.1 -e .
  ready || { echo "MLServer's virtualenv in $venv does not import mlserver 1.7.1 and serving.runtimes.mlserver" >&2; exit 1; }
fi
# An environment made before a pull holds this checkout's entry points as they were then (the plugin
# registries read them): the package's metadata is written again every time (no dependencies: seconds).
"$python_path" -m pip install --quiet --no-deps $(build_isolation) -e .
echo "MLServer's virtualenv ready in $venv ($(( $(date +%s) - started )) s)"
