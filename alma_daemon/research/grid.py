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
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alma_daemon.config import Config, ConfigError, build_config, read_yaml, set_dotted
from alma_daemon.core.atomic_json import write_json_atomic
from alma_daemon.logs import error_text
from alma_daemon.research.simulate import run_simulation


@dataclass(frozen=True)
class GridRun:
    """One combination: its folder name and its overrides."""

    name: str
    overrides: dict[str, Any]


def _short(value: Any) -> str:
    """A value as a folder name reads it: a section's values joined (``{name: fixed, wait: 10}``: ``fixed_10``)."""
    return "_".join(map(str, value.values())) if isinstance(value, dict) else str(value)


def expand_grid(spec: dict[str, Any]) -> list[GridRun]:
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError("grid: must map config keys to non-empty lists of values")
    keys = list(grid)
    runs = []
    for values in itertools.product(*(grid[k] for k in keys)):
        overrides = dict(zip(keys, values))
        name = ",".join(f"{k.split('.')[-1]}={_short(v)}" for k, v in overrides.items()) or "base"
        runs.append(GridRun(name.replace("/", "_"), overrides))
    return runs


def load_grid(path: str | Path) -> list[tuple[GridRun, Config | ConfigError]]:
    """The runs of a grid file, each with its config or the reason the config refuses it.

    Every combination is validated before the first one trains for hours: a combination the config
    refuses (e.g. learner.members with learner.name sm) is skipped at its turn; a mistake that every
    combination shares (a key in base or set) stops the grid here.
    """
    path = Path(path)
    spec = read_yaml(path)
    unknown = set(spec) - {"base", "set", "grid"}
    if unknown:
        raise ConfigError(f"unknown grid key '{sorted(unknown)[0]}' (known: base, set, grid)")
    base = read_yaml(path.parent / spec["base"]) if spec.get("base") else {}
    for key, value in (spec.get("set") or {}).items():
        set_dotted(base, key, value)
    runs = [(run, _config(base, run.overrides)) for run in expand_grid(spec)]
    refusals = [config for _, config in runs if isinstance(config, ConfigError)]
    if len(refusals) == len(runs):
        raise refusals[0]
    return runs


def _config(base: dict[str, Any], overrides: dict[str, Any]) -> Config | ConfigError:
    data = copy.deepcopy(base)
    try:
        for key, value in overrides.items():
            set_dotted(data, key, value)
        config = build_config(data)
        config.policy.check_stream_length(config.stream.megabatches)  # as run_simulation will, but up front
        return config
    except ConfigError as exc:
        return exc


def run_grid(path: str | Path, out: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run every combination; one that the config refuses or that fails is reported once (one line,
    and its entry in ``grid.json``) and the others still run."""
    runs = load_grid(path)
    out = Path(out)
    status: dict[str, Any] = {"grid": str(path), "runs": []}
    for i, (run, config) in enumerate(runs, start=1):
        folder = out / run.name
        entry = {"name": run.name, "overrides": run.overrides, "folder": str(folder)}
        print(f"[{i}/{len(runs)}] {run.name}")
        if isinstance(config, ConfigError):
            entry.update(status="failed", error=f"refused by the config: {config}")
            print(f"  not run, refused by the config: {config}")
        else:
            try:
                summary = run_simulation(config, folder, progress=progress)["summary"]
                entry.update(status="ok", summary=summary)
            except Exception as exc:
                entry.update(status="failed", error=error_text(exc))
                print(f"  failed: {error_text(exc)} (traceback in {folder / 'error.txt'})")
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "error.txt").write_text(traceback.format_exc())
        status["runs"].append(entry)
        write_json_atomic(out / "grid.json", status)
    return status
