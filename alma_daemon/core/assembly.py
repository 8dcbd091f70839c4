"""Engine assembly: the one place that builds an :class:`~alma_daemon.core.engine.Engine` from a config.

Both front doors call :func:`assemble_engine`: ``alma simulate`` (``research/simulate.py``) over an
in-memory buffer, starting fresh; the daemon (``service/bootstrap.py``) over its Redis buffer,
resumed from its committed state, the checkpoint of that state's model version and the policy's
saved state. The learner, the policy and the device come from the config the same way for both, and the
reference learner (``reference.kind``, core/reference.py) from the config and the state's JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file

from alma_daemon.config import Config, ConfigError
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.core.chunk_buffer import ChunkBuffer
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.core.engine_state import EngineState
from alma_daemon.core.reference import build_reference
from alma_daemon.core.task_fit import check_config_against_task
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import Learner, build_learner
from alma_daemon.measures import task_measure
from alma_daemon.runtime import resolve_device
from policies import build_policy


def assemble_engine(
    config: Config,
    task: TaskInfo,
    buffer: ChunkBuffer,
    *,
    test_set: LabeledData | None = None,
    checkpoints: CheckpointStore | None = None,
    state: EngineState | None = None,
    policy_state: dict[str, Any] | None = None,
    observers: list[EngineObserver] | tuple[EngineObserver, ...] = (),
) -> Engine:
    """An engine for a stream of ``task``: fresh, or resumed from ``state`` and ``policy_state``.

    A resumed state past model version 0 continues with that version's checkpoint from
    ``checkpoints``; otherwise the learner is built from ``config.learner`` and ``config.seed``.
    """
    check_config_against_task(config, task)
    check_measure(task)
    # reference.kind: linear on a task it cannot learn is refused here, before anything is built.
    reference = build_reference(config.reference.kind, task, state.reference if state is not None else None)
    device = resolve_device(config.device)
    version = state.model_version if state is not None else 0
    if version:
        if checkpoints is None:
            raise ValueError(f"resuming at model version {version} needs the checkpoint store that holds it")
        learner = checkpoints.load(version, str(device))
    else:
        learner = build_learner(config.learner.name, task, config.learner, config.seed)
        init_weights = getattr(config.learner, "init_weights", None)
        if init_weights is not None:
            start_from_deployed(learner, init_weights)
    policy = build_policy(config.policy)
    if policy_state is not None:
        policy.load_state_dict(policy_state)
    engine = Engine(
        learner,
        policy,
        buffer,
        config,
        device,
        test_set=test_set,
        checkpoints=checkpoints,
        observers=observers,
        state=state,
    )
    if version and checkpoints is not None:
        engine.team.restore(checkpoints, version)
    engine.reference = reference
    return engine


def check_measure(task: TaskInfo) -> None:
    """Refuse at start-up, in one line, a ``task.measure`` that does not fit the task."""
    try:
        task_measure(task)
    except ValueError as err:
        raise ConfigError(f"task.measure: {err}") from None


def start_from_deployed(learner: Learner, init_weights: str) -> None:
    """Load ``learner.init_weights``, a safetensors file, into a fresh learner (see :meth:`Learner.start_from`)."""
    path = Path(init_weights).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"learner.init_weights: no file {str(path)!r}; give a .safetensors file of the model's weights"
        )
    try:
        state = load_file(path)
    except (SafetensorError, OSError, ValueError) as err:
        raise ConfigError(f"learner.init_weights: {path} is not a safetensors file: {err}") from None
    learner.start_from(state, str(path))
