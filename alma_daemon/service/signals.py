"""Stop signals: SIGTERM or Ctrl-C finishes the current step, then stops; a second signal abandons
the step at once (safe: it was not committed and is redone on restart)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class StepAbandoned(KeyboardInterrupt):
    """A second stop signal arrived during a step; the step is dropped and redone on restart."""


class StopSignals:
    """SIGINT and SIGTERM handlers that ask the daemon to stop, installed for the main loop's run."""

    def __init__(self, stop_requested: threading.Event, request_stop: Callable[[], None], in_step: Callable[[], bool]):
        self.stop_requested = stop_requested
        self.request_stop = request_stop
        self.in_step = in_step
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> None:
        """Install the handlers (only the main thread can); :meth:`restore` puts the previous ones back."""
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stop_requested.is_set() and self.in_step():
            raise StepAbandoned(f"signal {signal.Signals(signum).name}: current step abandoned, redone on restart")
        log.warning(
            "stopping after the current step (signal again to abandon it)",
            extra={"signal": signal.Signals(signum).name},
        )
        self.request_stop()
