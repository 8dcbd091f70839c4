"""A checkpoint version rebuilt for a model server that reads the model store itself (KServe's model
server, :mod:`serving.runtimes.kserve`; MLServer, :mod:`serving.runtimes.mlserver`)."""

from __future__ import annotations

from alma_daemon.core.checkpoint_index import SPEC, CheckpointIndex
from alma_daemon.core.checkpoints import load_checkpoint
from alma_daemon.learners import Learner
from serving.runtimes.bundled_model import register_bundled_module


def served_learner(store: CheckpointIndex, version: int, device: str) -> Learner:
    """Checkpoint ``version`` of ``store`` (``spec.json`` and safetensors weights, no pickle; a team's
    ``learner.model`` module bundled beside them), on ``device`` and ready to answer."""
    folder = store.path(version)
    if not (folder / SPEC).is_file():
        raise FileNotFoundError(f"no checkpoint version {version} in {store.folder}")
    register_bundled_module(folder, folder / SPEC)
    learner = load_checkpoint(folder, device)
    learner.model.eval()
    return learner
