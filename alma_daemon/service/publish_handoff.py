"""The hand-off of new model versions to the publisher, once their step is committed.

A stage writes its checkpoint before its step commits, and the checkpoint of a step that never
commits is withdrawn (see :func:`serving.publishing.live_pointer.withdraw`): a version is handed to the
publisher only after the commit that keeps it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.logs import NOTICE
from serving.publishing.background import BackgroundPublisher

log = logging.getLogger(__name__)

#: How long a run that reached its --until-chunks target waits for the last version to be published.
PUBLISH_DRAIN_SECONDS = 120.0
#: A wait for the last version longer than this is told (``alma status``, and a notice line every
#: :data:`DRAIN_NOTICE_INTERVAL` seconds).
DRAIN_NOTICE_SECONDS = 3.0
DRAIN_NOTICE_INTERVAL = 10.0


class CheckpointClock(EngineObserver):
    """Remembers when each checkpoint was written, for the publisher's swap duration."""

    def __init__(self) -> None:
        self.written_at: dict[int, float] = {}

    def on_checkpoint(self, version: int, path: str, metrics: dict[str, Any], engine: Engine) -> None:
        self.written_at[version] = time.monotonic()

    def take(self) -> list[tuple[int, float]]:
        """The checkpoints written since the last call, oldest first."""
        written, self.written_at = sorted(self.written_at.items()), {}
        return written


class PublishHandoff:
    """Hands committed versions to the publisher (none when serving is off)."""

    def __init__(self, publisher: BackgroundPublisher | None):
        self.publisher = publisher
        self.clock = CheckpointClock()

    def start(self) -> None:
        if self.publisher is not None:
            self.publisher.start()

    def committed(self) -> None:
        """The step that wrote the latest checkpoints is committed: publish them."""
        for version, written_at in self.clock.take():
            if self.publisher is not None:
                self.publisher.submit(version, written_at=written_at)

    def reloading(self) -> None:
        """The engine is about to be reloaded: nothing handed over so far is published any more (see
        :func:`serving.publishing.live_pointer.withdraw`). Called before the reload deletes anything, so that the
        publisher cannot take it in between."""
        if self.publisher is not None:
            self.publisher.forget_pending()

    def reloaded(self, version: int) -> None:
        """The engine was reloaded at committed ``version`` (after :meth:`reloading`): forget the
        checkpoints written since the last commit and hand the committed version over again."""
        self.clock.take()
        if self.publisher is not None and version:
            self.publisher.submit(version)

    def drain(self, on_wait: Callable[[str], None] = lambda what: None) -> None:
        """Wait for the last version to be published (a scripted run's end); says so if it was not.

        A wait of more than :data:`DRAIN_NOTICE_SECONDS` is told as it goes: ``on_wait`` gets what
        is waited for (``the swap of version 12``: the daemon's phase, for ``alma status``), and a
        notice line repeats it every :data:`DRAIN_NOTICE_INTERVAL` seconds.
        """
        if self.publisher is None:
            return
        started = time.monotonic()
        idle = self.publisher.wait_idle(DRAIN_NOTICE_SECONDS)
        while not idle and (waited := time.monotonic() - started) < PUBLISH_DRAIN_SECONDS:
            behind = self.publisher.not_live()
            what = f"the swap of version {behind[0]}" if behind is not None else "the publisher"
            on_wait(what)
            log.log(
                NOTICE,
                f"the run is done; waiting for {what} before exiting: {waited:.0f} s so far, up to {PUBLISH_DRAIN_SECONDS:g} s",
                extra={"version": behind[0] if behind is not None else None, "waited_seconds": round(waited)},
            )
            idle = self.publisher.wait_idle(min(DRAIN_NOTICE_INTERVAL, PUBLISH_DRAIN_SECONDS - waited))
        behind = self.publisher.not_live()
        # A version the guard refused is a decision, not a failure: the publisher logged it.
        if behind is not None and (not idle or self.publisher.last_error is not None):
            reason = str(self.publisher.last_error) if idle else f"still publishing after {PUBLISH_DRAIN_SECONDS:g} s"
            log.warning(
                "the run ends before its last version is live",
                extra={"latest_version": behind[0], "live_version": behind[1], "reason": reason},
            )

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close(PUBLISH_DRAIN_SECONDS)
