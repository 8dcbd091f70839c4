"""Every check of a config against its task that needs no data (:func:`check_config_against_task`).

Start-up runs it on the task the stream's data defines (:func:`alma_daemon.core.assembly.assemble_engine`),
``alma config check`` on the task the config declares (:mod:`alma_daemon.data.declared_task`), so a
config refused at start-up for a reason the data does not decide is refused by ``config check`` in the
same line. Without torch: ``config check`` answers at once.
"""

from __future__ import annotations

from alma_daemon.config import Config, ConfigError
from alma_daemon.config.measure_traits import measure_misfit
from alma_daemon.core.reference_fit import require_river, resolved_kind
from alma_daemon.data.declared_task import declared_task
from alma_daemon.data.task_info import TaskInfo
from alma_daemon.data.task_terms import configured_task, drift_misfit, features_misfit


def check_config_against_task(config: Config, task: TaskInfo) -> None:
    """Refuse, in one line naming the key, a measure, drift, reference or event field names that do not
    fit ``task`` (already shaped by the config's terms: :func:`configured_task`)."""
    misfit = measure_misfit(task.measure, task.target_kind) if task.measure else None
    if misfit is not None:
        raise ConfigError(f"task.measure: {misfit}")
    for reason in (drift_misfit(config.stream.drift.kind, task), features_misfit(config, task)):
        if reason is not None:
            raise ConfigError(reason)
    resolved_kind(config.reference.kind, task)


def check_declared_task(config: Config) -> None:
    """What ``alma config check`` adds to the config's own validation: the config's terms applied to the
    task it declares, and checked against it; where only the data can tell the task, what needs none."""
    task = declared_task(config)
    if task is None:
        if config.reference.kind == "linear":
            require_river()
        return
    check_config_against_task(config, configured_task(task, config))
