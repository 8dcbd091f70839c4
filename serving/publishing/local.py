"""The embedded default (``serving.kind: local``): serving is a pointer in the model-store folder.

Checkpoint folders are immutable once written, so publishing a version copies nothing: the
guard decides, and ``<model_store>/<model>/live.json`` is atomically replaced to name the live
version. A process that serves predictions reads the pointer and loads that version's folder
with :func:`alma_daemon.core.checkpoints.load_checkpoint`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from serving.publishing.publisher import Candidate, Publisher, PublishError, guard_settings

if TYPE_CHECKING:
    from alma_daemon.config import Config
    from alma_daemon.core.checkpoints import CheckpointStore


class LocalPublisher(Publisher):
    """Publishes to the model-store folder itself; the live pointer is the only thing served."""

    kind = "local"

    @classmethod
    def from_config(cls, config: Config, store: CheckpointStore) -> LocalPublisher:
        serving = config.serving
        return cls(
            store, serving.promotion_margin, **guard_settings(serving), keep_checkpoints=config.daemon.keep_checkpoints
        )

    def ensure_serving(self, live: int) -> None:
        """Nothing to do: the pointer names the live version and nothing can unload it."""

    def stage(self, candidate: Candidate) -> None:
        """The candidate loaded from disk; check that its answers are numbers, as a server's probe would."""
        _, answers = candidate.probe()
        if not bool(torch.isfinite(answers).all()):
            raise PublishError("probe", f"version {candidate.version} answers NaN or infinite values", retry=False)

    def make_default(self, version: int) -> None:
        """The pointer write that follows is the switch."""

    def retire(self, live: int) -> None:
        """Nothing to release: the pointer serves one version (old ones are deleted from the model
        store past ``daemon.keep_checkpoints``, :mod:`serving.publishing.retention`)."""
