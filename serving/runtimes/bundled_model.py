"""A team's model module (``learner.model``) carried inside a model archive, or a checkpoint's folder.

The archive (for KServe, the checkpoint's folder) bundles the module's source file when the daemon
can find it, so a model server serves the code that trained the checkpoint without the team's
package installed; a package the daemon imports from a folder of several modules must be installed
in the server's environment too (docs/your-model.md). The server registers the bundled file under
the module's dotted name before it rebuilds the learner, so ``learner.model``'s import finds it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from alma_daemon.core.checkpoint_index import SPEC as SPEC_FILE

#: The bundled source's name in the archive (TorchServe flattens extra files into the model folder).
BUNDLED_SOURCE = "learner_model.py"


def model_module(spec: dict[str, Any]) -> str | None:
    """The dotted module name of the spec's ``learner.model``, if it has one."""
    path = spec.get("config", {}).get("model")
    return path.partition(":")[0] if path else None


def module_source(spec_file: str | Path) -> Path | None:
    """The source file of the checkpoint's ``learner.model`` module, to bundle (None: none, or not a file)."""
    name = model_module(json.loads(Path(spec_file).read_text()))
    if name is None:
        return None
    found = importlib.util.find_spec(name)
    origin = found.origin if found is not None else None
    return Path(origin) if origin and origin.endswith(".py") else None


def register_bundled_module(model_dir: str | Path, spec_file: str | Path) -> None:
    """Make the bundled source importable as the spec's ``learner.model`` module (no-op without one).

    A server that builds every version in one process (KServe's, MLServer) registers the module again
    where a version bundles other source than the module it holds: a team that changed its network's
    code gets the new code for the versions trained with it, while the versions built before keep
    the classes they were built from.
    """
    source = Path(model_dir) / BUNDLED_SOURCE
    name = model_module(json.loads(Path(spec_file).read_text()))
    if name is None or not source.is_file() or _holds_source(sys.modules.get(name), source):
        return
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def _holds_source(module: object, source: Path) -> bool:
    """Whether ``module`` (None: not imported) was made from a file that reads as ``source`` does."""
    origin = getattr(module, "__file__", None)
    if module is None or origin is None:
        return module is not None  # a module with no file (built in, or made in memory) is kept
    try:
        return Path(origin).read_bytes() == source.read_bytes()
    except OSError:
        return False  # its file is gone (a deleted version's): the bundled source replaces it


def bundle_module_source(checkpoint: str | Path) -> None:
    """Copy the source of the checkpoint's ``learner.model`` module into its folder, where a model
    server that reads the folder itself (KServe's, :mod:`serving.runtimes.kserve`) finds it; no-op
    without one, or where it is there already. Written under a temporary name and renamed."""
    target = Path(checkpoint) / BUNDLED_SOURCE
    source = module_source(Path(checkpoint) / SPEC_FILE)
    if source is None or target.is_file():
        return
    staging = target.with_name(f".{BUNDLED_SOURCE}.tmp")
    shutil.copyfile(source, staging)
    os.replace(staging, target)
