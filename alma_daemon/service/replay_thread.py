"""``alma run --replay``: the replayer in a thread of the daemon's process, resuming where the stream is."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from alma_daemon.config import Config
from alma_daemon.runtime import run_beside_training
from alma_daemon.transports.replay import chunk_source, replay, replay_publisher

log = logging.getLogger(__name__)


class ReplayThread:
    """Publishes ``config``'s dataset into the daemon's stream from a thread, from the first chunk the
    stream still lacks, until the dataset ends or ``stopping`` is set."""

    def __init__(
        self, config: Config, client: Any, stopping: threading.Event, on_failure: Callable[[], None] = lambda: None
    ):
        self.config = config
        self.client = client
        self.stopping = stopping
        #: Called when the replay fails: nothing else would feed the stream, so the daemon stops
        #: rather than wait for chunks that never come.
        self.on_failure = on_failure
        #: Why the replay failed; None while it runs and once it finished.
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="replay", daemon=True)

    def _run(self) -> None:
        run_beside_training()
        try:
            publisher, first = replay_publisher(self.config, self.client, stop=self.stopping.is_set)
            replay(
                chunk_source(self.config),
                publisher,
                self.config.daemon.stream,
                first_chunk=first,
                progress=False,
                stop=self.stopping.is_set,
            )
        except BaseException as exc:
            self.error = exc
            # `alma run` reports the failure in one line when it ends; -vv adds the traceback.
            log.debug("replay failed", exc_info=True)
            self.on_failure()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Wait (a few seconds at most) for the thread to end; it ends once ``stopping`` is set."""
        self._thread.join(timeout=5)
