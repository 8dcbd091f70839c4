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
import pytriton, torch, safetensors, serving.triton_model.served
from importlib.metadata import version
assert version('nvidia-pytriton') == '0.7.0' and torch.__version__.startswith('2.13.0'), (version('nvidia-pytriton'), torch.__version__)
" 2>/dev/null
}

if ! ready; then
  [ -x "$python_path" ] || python3 -m venv "$venv"
  # torch is pinned to the local CPU wheel (as in pyproject.toml): no CUDA packages.
  "$python_path" -m pip install --quiet torch==2.13.0 -e ".[triton]"
  ready || { echo "Triton's virtualenv in $venv does not import nvidia-pytriton 0.7.0, torch and serving.triton_model" >&2; exit 1; }
fi
# The Python backend's stub embeds the interpreter's shared library (libpython3.X.so): a Python built
# without one cannot run it (alma_daemon/local_servers/triton.py says so at start too).
"$python_path" -c "
import sys, sysconfig
from pathlib import Path
library = Path(sysconfig.get_config_var('LIBDIR') or '') / (sysconfig.get_config_var('INSTSONAME') or '')
sys.exit(0 if library.is_file() else f'{library} is missing: Triton\'s Python backend needs a Python built with --enable-shared')
"
echo "Triton's virtualenv ready in $venv ($(( $(date +%s) - started )) s)"
