"""Engine assembly: the one place that builds an :class:`~alma_daemon.core.engine.Engine` from a config.

Both front doors call :func:`assemble_engine`: ``alma simulate`` (``research/simulate.py``) over an
in-memory buffer, starting fresh; the daemon (``service/bootstrap.py``) over its Redis buffer,
resumed from its committed state, the checkpoint of that state's model version and the policy's
saved state. The learner, the policy and the device come from the config the same way for both.
"""

from __future__ import annotations

from alma_daemon.config import Config
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.core.chunk_buffer import ChunkBuffer
from alma_daemon.core.engine import Engine, EngineObserver, EngineState
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import build_learner
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
    policy_state: dict | None = None,
    observers: list[EngineObserver] | tuple[EngineObserver, ...] = (),
) -> Engine:
    """An engine for a stream of ``task``: fresh, or resumed from ``state`` and ``policy_state``.

    A resumed state past model version 0 continues with that version's checkpoint from
    ``checkpoints``; otherwise the learner is built from ``config.learner`` and ``config.seed``.
    """
    device = resolve_device(config.device)
    version = state.model_version if state is not None else 0
    if version:
        if checkpoints is None:
            raise ValueError(f"resuming at model version {version} needs the checkpoint store that holds it")
        learner = checkpoints.load(version, str(device))
    else:
        learner = build_learner(config.learner.name, task, config.learner, config.seed)
    policy = build_policy(config.policy)
    if policy_state is not None:
        policy.load_state_dict(policy_state)
    return Engine(
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
