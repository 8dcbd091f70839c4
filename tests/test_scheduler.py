"""The daemon's periodic jobs (alma_daemon/service/scheduler.py): a run skipped while the previous one still
runs is the design, not a warning; every other warning of APScheduler still reaches the log."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from alma_daemon.service.scheduler import build_scheduler


def test_a_run_skipped_behind_a_slow_one_is_not_warned_and_other_warnings_are(caplog: pytest.LogCaptureFixture):
    release = threading.Event()
    started = threading.Event()

    def slow_status() -> None:
        started.set()
        release.wait(5)

    scheduler = build_scheduler(0.05, policy_check=lambda: None, status=slow_status, health=lambda: None)
    with caplog.at_level(logging.WARNING, logger="apscheduler"):
        scheduler.start()
        try:
            assert started.wait(5)
            deadline = time.monotonic() + 0.5  # several intervals pass while the status job still runs
            while time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            release.set()
            scheduler.shutdown(wait=True)
        logging.getLogger("apscheduler.scheduler").warning("Job %s raised", "status")
    messages = [record.getMessage() for record in caplog.records]
    assert messages == ["Job status raised"], messages
