"""Checkpoints: ``<root>/<model>/<version>/`` with weights.safetensors, spec.json and metrics.json.

A version is written into a temporary folder, each file flushed to the disk (fsync), and renamed
into place, so a reader (the publisher, a restarted daemon) sees either a complete checkpoint or
none, after a power loss too. Versions are monotone integers. A number is written twice only when
the step that wrote it never committed: a restarted daemon deletes that version and redoes the step
(``alma_daemon/service/bootstrap.py``). Weights are safetensors: loading one never runs code.

A version is deleted (:meth:`CheckpointStore.delete`: an old one past ``daemon.keep_checkpoints``,
``serving/publishing/retention.py``, or an uncommitted one) by renaming its folder to a trash name first, so a
crash part-way leaves a trash folder that :meth:`CheckpointStore.sweep_trash` removes later, never
a half-deleted version.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file
from torch import nn

from alma_daemon.core.atomic_json import fsync_path, write_json_atomic
from alma_daemon.core.checkpoint_index import METRICS, SPEC, WEIGHTS, CheckpointIndex
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import Learner, learner_from_spec

#: A sample of the stage's validation data (``x``, ``y``) for the serving probe and promotion guard; with a
#: pooled validation set, the whole pool (and its ``ranks`` and ``seen``: core/example_reservoir.py).
VALIDATION = "validation.safetensors"
VALIDATION_SAMPLE = 512
#: The class-aware replay set the version's stage left (``stream.replay_keep: classes``).
REPLAY = "replay.safetensors"
#: A reservoir's name -> its file in a version's folder.
RESERVOIR_FILES = {"validation": VALIDATION, "replay": REPLAY}
#: The name a version's folder is renamed to before it is deleted: ``.trash-<version>-<random>``.
TRASH_PREFIX = ".trash-"


class CheckpointStore(CheckpointIndex):
    """The versions of one model under a model-store folder: writing and loading them too."""

    def save(
        self,
        learner: Learner,
        version: int,
        metrics: dict[str, Any],
        validation: LabeledData | None = None,
        reservoirs: dict[str, dict[str, torch.Tensor]] | None = None,
    ) -> Path:
        """Write ``version`` atomically; refuses to overwrite an existing version. ``reservoirs`` (by
        name, :data:`RESERVOIR_FILES`) are the stage's example reservoirs; a validation reservoir is
        saved instead of the sample of ``validation``."""
        target = self.path(version)
        if target.exists():
            raise FileExistsError(f"checkpoint version {version} already exists at {target}")
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=self.folder))
        try:
            save_weights(learner.model, tmp / WEIGHTS)
            write_json_atomic(tmp / SPEC, learner.spec(), indent=2, sort_keys=True)
            write_json_atomic(tmp / METRICS, {"version": version, **metrics}, indent=2, sort_keys=True)
            reservoirs = reservoirs or {}
            if validation is not None and len(validation) and "validation" not in reservoirs:
                sample = validation.subset(slice(0, VALIDATION_SAMPLE))
                save_file({"x": sample.x.contiguous().cpu(), "y": sample.y.contiguous().cpu()}, str(tmp / VALIDATION))
            for name, tensors in reservoirs.items():
                save_file(tensors, str(tmp / RESERVOIR_FILES[name]))
            # safetensors writes without fsync; the JSON files are synced by write_json_atomic. Without
            # this a power loss could leave the renamed folder, counted by versions(), with truncated
            # tensors.
            for name in (WEIGHTS, VALIDATION, REPLAY):
                if (tmp / name).is_file():
                    fsync_path(tmp / name)
            fsync_path(tmp)
            os.rename(tmp, target)
            fsync_path(self.folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target

    def delete(self, version: int) -> None:
        """Delete ``version``'s folder, complete or not: renamed to a trash name first (the rename
        reaches the disk before anything is removed), so that no crash leaves a part of it under its
        number."""
        target = self.path(version)
        if not target.exists():
            return
        trash = self.folder / f"{TRASH_PREFIX}{version}-{uuid.uuid4().hex[:8]}"
        os.rename(target, trash)
        fsync_path(self.folder)
        shutil.rmtree(trash)

    def sweep_trash(self) -> None:
        """Remove what a deletion cut short by a crash left behind."""
        if self.folder.is_dir():
            for trash in self.folder.glob(f"{TRASH_PREFIX}*"):
                shutil.rmtree(trash)

    def load(self, version: int, device: str = "cpu") -> Learner:
        return load_checkpoint(self.path(version), device)

    def validation(self, version: int) -> LabeledData | None:
        """The validation sample saved with ``version``, if any."""
        path = self.path(version) / VALIDATION
        if not path.is_file():
            return None
        tensors = load_file(str(path))
        return LabeledData(tensors["x"], tensors["y"])

    def reservoir(self, version: int, name: str) -> dict[str, torch.Tensor] | None:
        """The tensors of reservoir ``name`` saved with ``version`` (:data:`RESERVOIR_FILES`), or None where
        it saved none (a validation sample without ranks is no reservoir)."""
        path = self.path(version) / RESERVOIR_FILES[name]
        if not path.is_file():
            return None
        tensors = load_file(str(path))
        return tensors if "ranks" in tensors else None


def save_weights(model: nn.Module, path: Path) -> None:
    """``model``'s weights as safetensors, each tied tensor once, under the first of its names in sorted
    order (the one ``load_model`` reads back into every name tied to it).

    safetensors' ``save_model`` also records the dropped names in the header, a map it writes in an
    order that changes from run to run, so the same weights made different bytes, and the archive
    digests (serving) taken over them differed.
    """
    state = model.state_dict()
    kept: set[tuple[Any, ...]] = set()
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(state):
        tensor = state[name]
        tie = (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tensor.shape,
            tensor.stride(),
        )
        if tensor.numel() and tie in kept:
            continue
        kept.add(tie)
        tensors[name] = tensor.contiguous()
    save_file(tensors, str(path))


def load_checkpoint(path: str | Path, device: str = "cpu") -> Learner:
    """Rebuild the learner of a checkpoint folder: architecture from spec.json, weights from safetensors."""
    path = Path(path)
    learner = learner_from_spec(json.loads((path / SPEC).read_text()))
    load_model(learner.model, str(path / WEIGHTS), device=str(device))
    return learner.to(device)
