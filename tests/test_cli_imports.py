"""The command line answers at once: what a command imports before it needs it.

Importing torch takes about 2.3 s of CPU, the config models (pydantic) about 0.2 s; ``alma --help``
needs neither, and ``alma config check``, ``alma status`` and ``alma versions`` of a local model store
no torch (docs/benchmarks.md, "Command-line start-up"). Each case runs in a fresh interpreter, since
this one has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Runs ``alma ARGV...`` in process, then prints which of the modules named in argv[1] it imported.
PROBE = """
import json, sys
from alma_daemon.cli import main
watched, argv = json.loads(sys.argv[1]), sys.argv[2:]
try:
    code = main(argv)
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "imported": [m for m in watched if m in sys.modules]}))
"""


def imported(watched: list[str], *argv: str) -> dict:
    """The exit code of ``alma *argv`` and which of ``watched`` it imported."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(watched), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["replay", "--help"], ["config", "check", "--help"]])
def test_help_imports_neither_torch_nor_the_config_models(argv):
    assert imported(["torch", "pydantic"], *argv) == {"code": 0, "imported": []}


def test_config_check_imports_no_torch():
    assert imported(["torch"], "config", "check", "examples/mnist-sm.yaml") == {"code": 0, "imported": []}


def test_status_while_redis_is_down_imports_no_torch(tmp_path):
    (tmp_path / "daemon-status.json").write_text(json.dumps({"phase": "waiting", "heartbeat": 0}))
    overrides = ["--set", f"daemon.state_dir={tmp_path}", "--set", "redis.url=redis://127.0.0.1:1"]
    # Exit 1: Redis does not answer, and the status comes from the daemon's file.
    assert imported(["torch"], "status", *overrides) == {"code": 1, "imported": []}


def test_versions_of_a_local_model_store_imports_no_torch(tmp_path):
    version = tmp_path / "alma" / "1"
    version.mkdir(parents=True)
    for name, text in [("weights.safetensors", ""), ("spec.json", "{}"), ("metrics.json", '{"val_error": 0.1}')]:
        (version / name).write_text(text)
    overrides = [
        "--set",
        f"daemon.checkpoint_dir={tmp_path}",
        "--set",
        "serving.kind=local",
        "--set",
        "serving.model_name=alma",
    ]
    assert imported(["torch"], "versions", *overrides) == {"code": 0, "imported": []}
