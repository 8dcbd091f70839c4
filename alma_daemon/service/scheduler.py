"""The daemon's periodic jobs, driven by APScheduler (3.x) in a background thread.

- ``policy_check``: asks the main loop to consult the policy between chunks, so a time-based policy
  (``schedule``, ``budget``) can train without a new chunk arriving. The job only raises a flag:
  every engine call stays on the main thread, where stop signals are handled.
- ``status``: heartbeat, phase and memory in ``alma:{s}:daemon`` for ``alma status``.
- ``health``: Redis answers and the ingest thread runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from apscheduler.schedulers.background import BackgroundScheduler

#: Seconds between health checks (at least; never more often than the status job).
HEALTH_SECONDS = 5.0


class _SkippedRunFilter(logging.Filter):
    """Drops APScheduler's warning that a job's run was skipped because its previous run still runs: with
    ``max_instances`` 1 that is the design (a late run merges into the next), not a fault, and on a busy
    machine it came every few seconds, burying the warnings a user acts on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and "skipped: maximum number of running instances" in record.msg)


_SKIPPED_RUNS = _SkippedRunFilter()


def build_scheduler(
    poll_seconds: float,
    *,
    policy_check: Callable[[], None],
    status: Callable[[], None],
    health: Callable[[], None],
) -> BackgroundScheduler:
    """A not-yet-started scheduler running the three jobs; a late run is merged into the next, never doubled."""
    logging.getLogger("apscheduler.scheduler").addFilter(_SKIPPED_RUNS)
    scheduler = BackgroundScheduler(timezone="UTC", job_defaults={"coalesce": True, "max_instances": 1})
    scheduler.add_job(policy_check, "interval", seconds=poll_seconds, id="policy_check")
    scheduler.add_job(status, "interval", seconds=poll_seconds, id="status")
    scheduler.add_job(health, "interval", seconds=max(poll_seconds, HEALTH_SECONDS), id="health")
    return scheduler
