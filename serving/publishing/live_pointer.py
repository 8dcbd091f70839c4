"""What serves: the live pointer ``<model_store>/<model>/live.json``, the serving lock, and withdrawal.

The pointer names the live version and the newest version the guard has ruled on; it is replaced
atomically. Every process that changes serving (the daemon's publisher, ``alma rollback``, the
daemon's main thread withdrawing a version) does so under one file lock beside it. ``alma status``
reads the pointer from here without the publisher.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from alma_daemon.core.atomic_json import write_json_atomic
from serving.publishing.archiver import ARCHIVES, remove_archives

if TYPE_CHECKING:
    from alma_daemon.core.checkpoints import CheckpointStore

log = logging.getLogger(__name__)

LIVE_POINTER = "live.json"
LOCK_FILE = ".serving.lock"
#: How long ``rollback``, ``publish`` or :func:`withdraw` waits for another process's publishing to finish.
LOCK_TIMEOUT_SECONDS = 300.0


@dataclass
class ServingState:
    """The live pointer's content: what serves, and the newest version the guard has ruled on."""

    live: int | None = None
    #: Versions up to this one were promoted or refused; catching up after a restart starts above it.
    decided: int = 0
    updated_at: float = 0.0
    #: The version live before ``live``, which serves again if ``live`` is withdrawn (:func:`withdraw`).
    previous: int | None = None


class LivePointer:
    """``<model_store>/<model>/live.json``, replaced atomically, and the lock around changing it."""

    def __init__(self, folder: Path):
        self.path = folder / LIVE_POINTER
        self.lock_path = folder / LOCK_FILE

    def read(self) -> ServingState:
        if not self.path.is_file():
            return ServingState()
        data = json.loads(self.path.read_text())
        return ServingState(
            live=data.get("live"),
            decided=int(data.get("decided", 0)),
            updated_at=float(data.get("updated_at", 0.0)),
            previous=data.get("previous"),
        )

    def write(self, state: ServingState) -> None:
        state.updated_at = time.time()
        write_json_atomic(self.path, asdict(state), indent=2)

    @contextlib.contextmanager
    def locked(self, timeout: float = LOCK_TIMEOUT_SECONDS) -> Iterator[None]:
        """Hold an exclusive lock shared with other processes (the daemon, ``alma rollback``)."""
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as handle:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"another process has held {self.lock_path} for {timeout:.0f} s") from None
                    time.sleep(0.05)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def withdraw(store: CheckpointStore, version: int) -> None:
    """Remove ``version`` from serving and delete its checkpoint, whose step never committed.

    The restarted daemon redoes that step and writes the version again under the same number, maybe
    with other weights (training on a GPU is not bit for bit repeatable); the redone version must be
    guarded and published as a new one, not skipped as decided. So the pointer forgets this one:
    where it was live, ``previous`` is live again (or, where the pointer names none, the newest
    version below it on disk), and ``decided`` drops below it; its archives and its folder are
    deleted (the folder renamed to a trash name first, :meth:`CheckpointStore.delete`). All of it
    happens under the serving lock (waited for at most :data:`LOCK_TIMEOUT_SECONDS`), so a publish
    never sees one part done without the others.
    docs/serving.md tells the whole story, a server still answering with the version included.
    """
    pointer = LivePointer(store.folder)
    with pointer.locked():
        state = pointer.read()
        withdrawn = replace(state, decided=min(state.decided, version - 1))
        if state.live == version:
            below = [v for v in store.versions() if v < version]
            fallback = state.previous if state.previous is not None else (below[-1] if below else None)
            withdrawn.live, withdrawn.previous = fallback, None
        elif state.previous == version:
            withdrawn.previous = None
        if pointer.path.is_file() and withdrawn != state:
            pointer.write(withdrawn)
            log.warning(
                "withdrew a version from serving",
                extra={"version": version, "live": withdrawn.live, "decided": withdrawn.decided},
            )
        remove_archives(store.folder / ARCHIVES, store.model_name, version)
        store.delete(version)
