"""A team's model module (``learner.model``) carried inside a model archive.

The archive bundles the module's source file when the daemon can find it, so a TorchServe worker
serves the code that trained the checkpoint without the team's package installed; a package the
daemon imports from a folder of several modules must be installed in the worker's environment too
(docs/your-model.md). The worker registers the bundled file under the module's dotted name before
it rebuilds the learner, so ``learner.model``'s import finds it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

#: The bundled source's name in the archive (TorchServe flattens extra files into the model folder).
BUNDLED_SOURCE = "learner_model.py"


def model_module(spec: dict) -> str | None:
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
    """Make the bundled source importable as the spec's ``learner.model`` module (no-op without one)."""
    source = Path(model_dir) / BUNDLED_SOURCE
    name = model_module(json.loads(Path(spec_file).read_text()))
    if name is None or not source.is_file() or name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
