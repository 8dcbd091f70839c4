"""Lowering a model server's CPU priority, so that training keeps the cores of a machine it shares with
serving (``serving.niceness``, docs/serving.md#sharing-a-machine-with-training).

Two levers, both needed on Linux:

- a nice value belongs to a thread: ``setpriority(PRIO_PROCESS, id)`` changes the thread whose id it
  is, so a process that already runs threads (a web server's, torch's) has each one lowered; threads
  started later inherit the value of the thread that starts them;
- autogroup scheduling (on by default) shares the CPU fairly between sessions first and applies nice
  values only within one, so a server in a session of its own would still take half of the cores
  from training however nice its threads are. The session's own nice value, in
  ``/proc/<pid>/autogroup``, is what counts between sessions.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

#: The niceness a model server's worker takes once its version is loaded (``serving.niceness``): set by
#: ``alma serve`` in TorchServe's and Triton's environment, which their model processes inherit.
NICENESS_ENV = "ALMA_SERVING_NICENESS"


def lower_own_priority(niceness: int) -> None:
    """Run every thread of this process, and the threads it starts from now on, at ``niceness``, and
    lower its session's autogroup the same. Never raises: a priority that cannot be lowered leaves the
    server serving at the one it has."""
    tasks = Path("/proc/self/task")
    thread_ids = [int(task.name) for task in tasks.iterdir()] if tasks.is_dir() else [0]  # 0: this process
    for thread_id in thread_ids:
        try:
            os.setpriority(os.PRIO_PROCESS, thread_id, niceness)
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except OSError as err:  # PermissionError where it already runs at a higher nice value
            log.info("could not lower a thread's priority", extra={"niceness": niceness, "error": str(err)})
    set_session_niceness(os.getpid(), niceness)


def set_session_niceness(pid: int, niceness: int) -> None:
    """Lower the autogroup of the session that process ``pid`` belongs to (module docstring)."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{niceness}\n")
    except OSError as err:
        log.info(
            "no autogroup scheduling here: only the server's own nice value yields to training",
            extra={"pid": pid, "error": str(err)},
        )


def lower_priority_once_loaded() -> None:
    """A model process (a TorchServe worker, a Triton Python-backend model) loaded its version at the
    priority its server started at, normal: on a busy machine a load at niceness 19 outlasted
    TorchServe's worker start-up limit. From now on it, and the session's autogroup that later
    versions load in, yield the cores to training (``NICENESS_ENV``; unset or 0: nothing changes)."""
    niceness = int(os.environ.get(NICENESS_ENV) or 0)
    if niceness > 0:
        lower_own_priority(niceness)
