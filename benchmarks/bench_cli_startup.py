"""CPU time of the command line's start-up: ``alma --help`` and the commands that read but never train.

Each command runs ``--runs`` times in a fresh interpreter; reported: the median CPU seconds (user +
system) of that process, and whether it imported torch. ``status`` and ``versions`` run on a state
folder that holds no daemon, so they stop where a daemon's state would first be read (exit 1 and 0).
``--checkout DIR`` runs the package of another checkout (e.g. an export of an earlier commit, for
the figures before a change: the commands run in it, which puts it first on ``sys.path``);
``--label`` names the figures in the output file, which keeps the other labels' figures.

    python benchmarks/bench_cli_startup.py --label after    # writes benchmarks/results/cli_startup.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: Runs ``alma ARGV...`` in process and prints whether it imported torch.
PROBE = """
import sys
from alma_daemon.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("torch" in sys.modules)
"""


def commands(state: Path) -> dict[str, list[str]]:
    settings = ["--set", f"daemon.state_dir={state}", "--set", f"daemon.checkpoint_dir={state / 'models'}"]
    return {
        "alma --help": ["--help"],
        "alma run --help": ["run", "--help"],
        "alma config check examples/mnist-sm.yaml": ["config", "check", "examples/mnist-sm.yaml"],
        "alma status (no daemon state)": ["status", *settings],
        "alma versions (no versions)": ["versions", "--set", "serving.kind=local", *settings],
    }


def child_cpu_seconds(argv: list[str], checkout: Path) -> tuple[float, bool]:
    """CPU seconds of one run of the probe with ``argv`` in ``checkout``, and whether it imported torch."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=checkout, timeout=300, check=False
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, result.stdout.strip().splitlines()[-1] == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (the median is kept)")
    parser.add_argument("--label", default="after", help="the name of these figures in the output file")
    parser.add_argument("--checkout", default=".", help="run the alma_daemon of this checkout (default: this one)")
    parser.add_argument("--out", default="benchmarks/results/cli_startup.json")
    args = parser.parse_args()
    checkout = Path(args.checkout).resolve()
    figures: dict = {"load_average_before": os.getloadavg(), "runs": args.runs, "commands": {}}
    with tempfile.TemporaryDirectory() as folder:
        for name, argv in commands(Path(folder)).items():
            runs = [child_cpu_seconds(argv, checkout) for _ in range(args.runs)]
            cpu = statistics.median(seconds for seconds, _ in runs)
            torch = any(imported for _, imported in runs)
            figures["commands"][name] = {"cpu_seconds": cpu, "imports_torch": torch}
            print(f"{name:<42} {cpu:5.2f} s CPU (median of {args.runs}){', imports torch' if torch else ''}")
    figures["load_average_after"] = os.getloadavg()
    out = Path(args.out)
    every = json.loads(out.read_text()) if out.is_file() else {}
    every[args.label] = figures
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(every, indent=1))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
