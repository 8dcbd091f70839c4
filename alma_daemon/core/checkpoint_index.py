"""Reading a model store without loading a model: its complete versions and their metrics.

The writing and loading side, and the layout's description, are :mod:`alma_daemon.core.checkpoints`;
this half imports no torch, so ``alma versions`` and ``alma status`` answer at once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WEIGHTS, SPEC, METRICS = "weights.safetensors", "spec.json", "metrics.json"


class CheckpointIndex:
    """The versions of one model under a model-store folder, as far as reading their files goes."""

    def __init__(self, root: str | Path, model_name: str):
        self.root = Path(root)
        self.model_name = model_name
        self.folder = self.root / model_name

    def path(self, version: int) -> Path:
        return self.folder / str(version)

    def versions(self) -> list[int]:
        """Complete versions, oldest first."""
        if not self.folder.is_dir():
            return []
        found = []
        for child in self.folder.iterdir():
            if child.name.isdigit() and all((child / f).is_file() for f in (WEIGHTS, SPEC, METRICS)):
                found.append(int(child.name))
        return sorted(found)

    def latest(self) -> int | None:
        versions = self.versions()
        return versions[-1] if versions else None

    def metrics(self, version: int) -> dict[str, Any] | None:
        """``version``'s metrics.json; None where the version was deleted since it was listed (the
        daemon keeps only the newest ``daemon.keep_checkpoints``, see ``serving/publishing/retention.py``)."""
        try:
            return json.loads((self.path(version) / METRICS).read_text())
        except FileNotFoundError:
            return None
