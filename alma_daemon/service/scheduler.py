"""The daemon's periodic jobs, driven by APScheduler (3.x) in a background thread.

- ``policy_check``: asks the main loop to consult the policy between chunks, so a time-based policy
  (``schedule``, ``budget``) can train without a new chunk arriving. The job only raises a flag:
  every engine call stays on the main thread, where stop signals are handled.
- ``status``: heartbeat, phase and memory in ``alma:{s}:daemon`` for ``alma status``.
- ``health``: Redis answers and the ingest thread runs.
"""

from __future__ import annotations

from typing import Protocol

from apscheduler.schedulers.background import BackgroundScheduler

#: Seconds between health checks (at least; never more often than the status job).
HEALTH_SECONDS = 5.0


class DaemonJobs(Protocol):
    def request_policy_check(self) -> None: ...

    def write_status(self) -> None: ...

    def check_health(self) -> None: ...


def build_scheduler(jobs: DaemonJobs, poll_seconds: float) -> BackgroundScheduler:
    """A not-yet-started scheduler running the three jobs; a late run is merged into the next, never doubled."""
    scheduler = BackgroundScheduler(timezone="UTC", job_defaults={"coalesce": True, "max_instances": 1})
    scheduler.add_job(jobs.request_policy_check, "interval", seconds=poll_seconds, id="policy_check")
    scheduler.add_job(jobs.write_status, "interval", seconds=poll_seconds, id="status")
    scheduler.add_job(jobs.check_health, "interval", seconds=max(poll_seconds, HEALTH_SECONDS), id="health")
    return scheduler
