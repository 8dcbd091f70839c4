#!/usr/bin/env bash
# Triton Inference Server for `alma serve --kind triton` and tests/test_serving_triton.py, in a virtualenv
# of its own (.venvs/triton): the `triton` extra (nvidia-pytriton 0.7.0, whose wheel bundles a CPU-capable
# tritonserver 2.51 and its Python backend) pins numpy below 2, which the package's own environment does
# not share. The virtualenv's Python is also the one Triton's Python backend runs the checkpoints in, so it
# gets torch (the CPU wheel) and alma-daemon from this checkout. Idempotent: a second run only checks.
# Where alma_daemon/local_servers/triton.py looks: ALMA_TRITON_PYTHON, default .venvs/triton/bin/python.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)

python_path="${ALMA_TRITON_PYTHON:-$PWD/.venvs/triton/bin/python}"
venv="$(dirname "$(dirname "$python_path")")"

ready() {
  [ -x "$python_path" ] && "$python_path" -c "
import pytriton, torch, safetensors, serving.runtimes.triton.served
from importlib.metadata import version
assert version('nvidia-pytriton') == '0.7.0' and torch.__version__.startswith('2.13.0'), (version('nvidia-pytriton'), torch.__version__)
" 2>/dev/null
}

# --no-build-isolation where the interpreter has setuptools 77 or newer (pyproject.toml's build-system).
build_isolation() {
  "$python_path" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" 2>/dev/null &&
    echo --no-build-isolation
  return 0
}

if ! ready; then
  # --system-site-packages: torch and the package's other dependencies come from the package's own
  # environment (scripts/setup.sh installs it first) where their versions fit, not installed again
  # (1.2 GB: this script took 6 minutes on 2 cores, now about 1); numpy below 2 (the wheel's pin) and
  # what else differs pip installs here, ahead of the shared ones on the path (the shared wheels built
  # against numpy 2 run on 1.26: NumPy 2's builds are backward compatible), and then lists the shared
  # packages that want numpy 2 (River): not used here. --without-pip: that environment's pip runs
  # here too (no ensurepip, no old pip to outdo).
  [ -x "$python_path" ] || python3 -m venv --system-site-packages --without-pip "$venv"
  "$python_path" -m pip --version >/dev/null 2>&1 || "$python_path" -m ensurepip --default-pip >/dev/null
  # torch is pinned to the local CPU wheel (as in pyproject.toml): no CUDA packages. The checkout is
  # built with the setuptools at hand where it is new enough, without an isolated build environment.
  "$python_path" -m pip install --quiet $(build_isolation) torch==2.13.0 -e ".[triton]"
  ready || { echo "Triton's virtualenv in $venv does not import nvidia-pytriton 0.7.0, torch and serving.runtimes.triton" >&2; exit 1; }
fi
# An environment made before a pull holds this checkout's entry points as they were then (the plugin
# registries read them): the package's metadata is written again every time (no dependencies: seconds).
"$python_path" -m pip install --quiet --no-deps $(build_isolation) -e .
# The Python backend's stub embeds the interpreter's shared library (libpython3.X.so): a Python built
# without one cannot run it (alma_daemon/local_servers/triton.py says so at start too).
"$python_path" -c "
import sys, sysconfig
from pathlib import Path
library = Path(sysconfig.get_config_var('LIBDIR') or '') / (sysconfig.get_config_var('INSTSONAME') or '')
sys.exit(0 if library.is_file() else f'{library} is missing: Triton\'s Python backend needs a Python built with --enable-shared')
"
echo "Triton's virtualenv ready in $venv ($(( $(date +%s) - started )) s)"
