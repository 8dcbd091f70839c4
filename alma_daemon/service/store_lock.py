"""One daemon per model store (hence per stream, on one machine): an OS file lock in the store, held while ``alma run`` runs.

A model store folder (``<daemon.checkpoint_dir>/<serving.model_name>``) belongs to one stream: its
``stream-identity.json`` says which. Two daemons on it would train the same chunks side by side
and collide on the same checkpoint version. So rank 0 of ``alma run`` takes ``flock(LOCK_EX |
LOCK_NB)`` on ``<store>/.daemon.lock`` before it connects to Redis, restores or trains, and keeps it
until the process ends. The kernel releases the lock when the process dies, however it dies: a
restart right after ``kill -9`` is never refused, and a lock file left behind blocks nothing. The
holder writes its pid into the file, for the refusal's message.

The lock is per machine (and per file system that honours ``flock``): two daemons on different
machines that share one Redis stream are not caught. Run one replica (docs/service.md, "Limits").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from collections.abc import Iterator

from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.service.components import Component

log = logging.getLogger(__name__)

LOCK_FILE = ".daemon.lock"
#: What ``flock`` answers on a file system without locks (an NFS mount without a lock manager).
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


class StreamTaken(RuntimeError):
    """Another process holds the model store's daemon lock: a daemon already runs on this stream."""


@contextlib.contextmanager
def hold_store_lock(store: CheckpointStore) -> Iterator[None]:
    """Hold the daemon lock of ``store`` for the block; raise :class:`StreamTaken` if another process has it."""
    store.folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(store.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StreamTaken(
                f"another daemon{_holder(fd)} is already running on model store {store.folder} (one daemon per stream)"
            ) from None
        except OSError as exc:
            if exc.errno not in NO_LOCKS:
                raise
            log.warning(
                "the model store's file system has no locks: a second daemon on this stream would not be refused",
                extra={"store": str(store.folder), "error": os.strerror(exc.errno)},
            )
        else:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


class StoreLock(Component):
    """The lock as a component of ``alma run``: held from its start, before Redis, until its stop."""

    name = "store lock"

    def __init__(self, store: CheckpointStore):
        self.store = store
        self._held = contextlib.ExitStack()

    def start(self) -> None:
        self._held.enter_context(hold_store_lock(self.store))

    def stop(self) -> None:
        self._held.close()


def _holder(fd: int) -> str:
    """`` (pid N)`` from the lock file, or nothing while the holder has not written it yet."""
    pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return f" (pid {pid})" if pid.isdigit() else ""
