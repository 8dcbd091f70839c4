"""What the daemon's main loop waits on, and what the other threads may ask of it (service/daemon.py)."""

from __future__ import annotations

import threading


class LoopControl:
    """The main loop's flags: a stop asked for, a wake-up (a chunk is ready), a policy check due, and
    whether a step runs (a second stop signal abandons it then: service/signals.py)."""

    def __init__(self) -> None:
        self.stop_requested = threading.Event()
        self.wake = threading.Event()
        self.policy_check_due = threading.Event()
        #: Set by the main loop while it runs a step, until its commit begins.
        self.in_step = False

    def request_stop(self) -> None:
        self.stop_requested.set()
        self.wake.set()

    def request_policy_check(self) -> None:
        """Ask the main loop to let the policy decide between chunks (time-based policies)."""
        self.policy_check_due.set()
        self.wake.set()

    def chunk_ready(self) -> None:
        """A chunk is complete in Redis (the ingest thread): the waiting main loop looks at once."""
        self.wake.set()
