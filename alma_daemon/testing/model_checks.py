"""A team's model under the learner contract: every model learner's checks on its data, and the deployed
weights loading back (:func:`yield_model_checks`); :func:`check_model` runs them all."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterable, Iterator
from functools import partial

import numpy as np
import torch
from numpy.typing import ArrayLike
from safetensors.torch import load_file, save_file

from alma_daemon.config import learner_config
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import build_learner
from alma_daemon.models.backbones import Normalize
from alma_daemon.models.user_model import import_factory
from alma_daemon.testing.checks import Check, answers_alike, expect, run_checks
from alma_daemon.testing.learner_checks import yield_learner_checks

#: The learners that build their networks from ``learner.model`` (firefly refuses a user's module).
MODEL_LEARNERS = ("sm", "ens", "umix", "gens", "gmoe")
#: Those that start from ``learner.init_weights`` (gmoe refuses it: its mixtures of experts do not fit a deployed model's weights).
DEPLOYED_LEARNERS = ("sm", "ens", "umix", "gens")


def yield_model_checks(
    model: str,
    task: TaskInfo,
    data: LabeledData | tuple[ArrayLike, ArrayLike],
    learners: Iterable[str] = MODEL_LEARNERS,
    optimizer: str = "adam",
    init_weights: str | None = None,
) -> Iterator[Check]:
    """The checks of :func:`check_model`, each named after its learner (``ens-probabilities_sum_to_one``)."""
    data = as_labeled(data, task)
    cut = max(1, len(data) * 3 // 4)
    train, val = data.subset(torch.arange(cut)), data.subset(torch.arange(cut, len(data)))
    learners = list(learners)
    for name in learners:
        keys = {"model": model, "members": 2} if name in ("ens", "umix") else {"model": model}
        for check in yield_learner_checks(name, task, train, val, keys, optimizer):
            yield dataclasses.replace(check, name=f"{name}-{check.name}")
    for name in learners:
        if name in DEPLOYED_LEARNERS:
            starts = partial(starts_from_the_deployed_weights, name, model, task, train, init_weights)
            yield Check(f"{name}-starts_from_the_deployed_weights", starts)


def check_model(
    model: str,
    task: TaskInfo,
    data: LabeledData | tuple[ArrayLike, ArrayLike],
    learners: Iterable[str] = MODEL_LEARNERS,
    optimizer: str = "adam",
    init_weights: str | None = None,
) -> None:
    """Run the contract of every learner in ``learners`` on ``learner.model = model`` and ``data`` (a few
    hundred labeled examples of the team's: a LabeledData, or (x, y) as numpy arrays or tensors), then
    start each from the deployed weights: the file ``init_weights`` (the one ``learner.init_weights``
    will name), else the factory's module's own.

    Raises :class:`~alma_daemon.testing.checks.ContractError` (or the one-line ``ConfigError`` the daemon
    would stop with).
    """
    run_checks(yield_model_checks(model, task, data, learners, optimizer, init_weights))


def as_labeled(data: LabeledData | tuple[ArrayLike, ArrayLike], task: TaskInfo) -> LabeledData:
    """``data`` as tensors: features as float32 (uint8 pixels kept), labels as int64 (a regression's as float32)."""
    raw_x, raw_y = (data.x, data.y) if isinstance(data, LabeledData) else data
    x = raw_x if isinstance(raw_x, torch.Tensor) else torch.as_tensor(np.asarray(raw_x))
    y = raw_y if isinstance(raw_y, torch.Tensor) else torch.as_tensor(np.asarray(raw_y))
    if x.dtype != torch.uint8 or not task.pixels:
        x = x.float()
    y = y.float() if task.regression else y.long()
    return LabeledData(x, y)


def starts_from_the_deployed_weights(
    name: str, model: str, task: TaskInfo, data: LabeledData, init_weights: str | None
) -> None:
    """Learner ``name`` started from the deployed weights (the file ``init_weights``, else a factory
    module's saved weights), as the engine starts it, answers as the factory's module holding them:
    its probabilities, or a regression's numbers in the target's units."""
    deployed = import_factory(model)(task).eval()
    with tempfile.TemporaryDirectory() as folder:
        path = init_weights or f"{folder}/deployed.safetensors"
        if init_weights is None:
            save_file({k: v.contiguous() for k, v in deployed.state_dict().items()}, path)
        else:
            weights = load_file(init_weights)
            expect(
                weights.keys() == deployed.state_dict().keys(),
                f"{init_weights}: its keys are not those of {model}'s module "
                f"({sorted(weights.keys() ^ deployed.state_dict().keys())[:4]} differ)",
            )
            deployed.load_state_dict(weights)
        learner = build_learner(name, task, learner_config({"model": model, "init_weights": path}, name=name), 0)
        learner.start_from(load_file(path), path)
    if learner.awaits_statistics:
        learner.take_statistics(data)
    normalize = next(m for m in learner.model.modules() if isinstance(m, Normalize))
    with torch.no_grad():
        expected = learner.training_loss.answers(deployed(normalize(data.x)))
    expect(
        answers_alike(learner.predict_outputs(data.x), expected, atol=1e-5),
        f"{name}: started from the deployed weights, it answers otherwise than the deployed module",
    )
