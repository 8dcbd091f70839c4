"""How many model versions stay on disk (``daemon.keep_checkpoints``): deleting the others.

A daemon that trains every few chunks writes thousands of versions a year. Kept are the newest
``keep`` versions the publisher has ruled on (promoted, refused, or passed over for a newer one),
the live version, the one live before it (which serves again if the live one is withdrawn,
:func:`serving.publishing.live_pointer.withdraw`) and every version not yet ruled on; the others are deleted
with their archives. The newest ruled-on version is the committed one, or the one after it where
Redis lost that commit (``keep`` is at least 2), so the version the engine resumes from is never
deleted.

Every deletion happens under the serving lock, which every reader of an old version holds too (a
publish's guard and its top-up from earlier samples, ``alma rollback``, a withdrawal), so nothing is
deleted while it is read or made live. The publisher prunes after each promotion or refusal; with
``serving.kind: none`` the main thread prunes after each step commits (:func:`prune_after_commit`).
docs/serving.md, "How many versions stay on disk".
"""

from __future__ import annotations

import contextlib
import logging

from alma_daemon.core.checkpoints import CheckpointStore
from serving.publishing.archiver import ARCHIVES, remove_archives
from serving.publishing.live_pointer import LivePointer, ServingState

log = logging.getLogger(__name__)


def unneeded(versions: list[int], keep: int, state: ServingState, ruled_up_to: int | None) -> list[int]:
    """The versions of ``versions`` (oldest first) to delete: those up to ``ruled_up_to`` (all for
    None) but the newest ``keep`` of them, ``state``'s live version and the one before it."""
    ruled = [v for v in versions if ruled_up_to is None or v <= ruled_up_to]
    kept = {*ruled[-keep:], state.live, state.previous}
    return [v for v in ruled if v not in kept]


def prune(store: CheckpointStore, keep: int, state: ServingState, ruled_up_to: int | None) -> list[int]:
    """Delete the :func:`unneeded` versions and their archives, and what a deletion cut short by a
    crash left; returns the versions deleted. The caller holds the serving lock."""
    store.sweep_trash()
    deleted = unneeded(store.versions(), keep, state, ruled_up_to)
    for version in deleted:
        remove_archives(store.folder / ARCHIVES, store.model_name, version)
        store.delete(version)
    if deleted:
        log.info(
            "deleted old model versions",
            extra={"versions": deleted, "keep_checkpoints": keep},
        )
    return deleted


def prune_after_commit(store: CheckpointStore, keep: int) -> list[int]:
    """``serving.kind: none``, where no publisher prunes: the main thread's prune once a step has
    committed (every version on disk is then committed). It never waits: where another process holds
    the serving lock (``alma rollback``), the next commit prunes. A failure to delete is logged; the
    daemon goes on."""
    pointer = LivePointer(store.folder)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(pointer.locked(timeout=0))
        except TimeoutError:
            log.info("the serving lock is held; old model versions are deleted after the next step")
            return []
        try:
            return prune(store, keep, pointer.read(), None)
        except OSError as err:
            log.warning("deleting old model versions failed", extra={"error": str(err)})
            return []
