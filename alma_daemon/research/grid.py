"""``alma grid``: one simulation per combination of config values, results in one folder.

A grid file::

    base: examples/mnist-sm.yaml      # relative to the grid file; optional
    set: {stream.megabatches: 10}      # fixed overrides; optional
    grid:                              # every combination of these runs
      learner.name: [sm, ens]
      policy.wait: [1, 5, 10]
"""

from __future__ import annotations

import copy
import itertools
import logging
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alma_daemon.config import ConfigError, build_config, read_yaml, set_dotted
from alma_daemon.core.atomic_json import write_json_atomic
from alma_daemon.research.simulate import run_simulation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GridRun:
    """One combination: its folder name and its overrides."""

    name: str
    overrides: dict


def expand_grid(spec: dict) -> list[GridRun]:
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError("grid: must map config keys to non-empty lists of values")
    keys = list(grid)
    runs = []
    for values in itertools.product(*(grid[k] for k in keys)):
        overrides = dict(zip(keys, values))
        name = ",".join(f"{k.split('.')[-1]}={v}" for k, v in overrides.items()) or "base"
        runs.append(GridRun(name.replace("/", "_"), overrides))
    return runs


def load_grid(path: str | Path) -> tuple[dict, list[GridRun]]:
    """The base config data (with fixed overrides applied) and the runs of a grid file."""
    path = Path(path)
    spec = read_yaml(path)
    unknown = set(spec) - {"base", "set", "grid"}
    if unknown:
        raise ConfigError(f"unknown grid key '{sorted(unknown)[0]}' (known: base, set, grid)")
    base = read_yaml(path.parent / spec["base"]) if spec.get("base") else {}
    for key, value in (spec.get("set") or {}).items():
        set_dotted(base, key, value)
    runs = expand_grid(spec)
    # Validate every combination before spending hours on the first. A combination the config refuses
    # (e.g. learner.members with learner.name sm) fails at its turn, reported; a mistake every
    # combination shares (a key in base or set) stops the grid here.
    refused = []
    for run in runs:
        try:
            build_config(_with_overrides(base, run.overrides))
        except ConfigError as exc:
            refused.append(exc)
            log.warning("grid run refused by the config", extra={"run": run.name, "error": str(exc)})
    if len(refused) == len(runs):
        raise refused[0]
    return base, runs


def _with_overrides(base: dict, overrides: dict) -> dict:
    data = copy.deepcopy(base)
    for key, value in overrides.items():
        set_dotted(data, key, value)
    return data


def run_grid(path: str | Path, out: str | Path, progress: bool = True) -> dict:
    """Run every combination; a failed run is reported in ``grid.json`` and skipped."""
    base, runs = load_grid(path)
    out = Path(out)
    status: dict[str, Any] = {"grid": str(path), "runs": []}
    for i, run in enumerate(runs, start=1):
        folder = out / run.name
        entry = {"name": run.name, "overrides": run.overrides, "folder": str(folder)}
        print(f"[{i}/{len(runs)}] {run.name}")
        try:
            config = build_config(_with_overrides(base, run.overrides))
            summary = run_simulation(config, folder, progress=progress)["summary"]
            entry.update(status="ok", summary=summary)
        except Exception as exc:
            entry.update(status="failed", error=f"{type(exc).__name__}: {exc}")
            log.warning("grid run failed", extra={"run": run.name, "error": str(exc)})
            print(f"  failed: {type(exc).__name__}: {exc}")
            (out / run.name).mkdir(parents=True, exist_ok=True)
            (out / run.name / "error.txt").write_text(traceback.format_exc())
        status["runs"].append(entry)
        write_json_atomic(out / "grid.json", status)
    return status
