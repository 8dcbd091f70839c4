"""The learner contract as functions: each check raises :class:`ModelCheckError` naming what failed."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable

import numpy as np
import torch
from numpy.typing import ArrayLike
from safetensors.torch import load_file, save_file

from alma_daemon.config import TrainConfig, learner_config
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import Learner, build_learner, learner_from_spec
from alma_daemon.models.backbones import Normalize
from alma_daemon.models.user_model import import_factory
from alma_daemon.training.loop import Trainer

#: The learners that build their networks from ``learner.model`` (firefly refuses a user's module).
MODEL_LEARNERS = ("sm", "ens", "umix", "gens", "gmoe")


class ModelCheckError(AssertionError):
    """A learner or a user's model breaks the contract; the message says which check and why."""


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise ModelCheckError(what)


def small_trainer(stage: int, optimizer: str = "adam") -> Trainer:
    """A trainer of two short epochs: enough to move the weights, quick on a CPU."""
    config = TrainConfig(epochs=2, patience=1, batch_size=32, steps_per_chunk=4, warmup_steps=1)
    return Trainer(config, optimizer, torch.device("cpu"), seed=stage, augment=False)


def fit_stage(learner: Learner, train: LabeledData, val: LabeledData, stage: int, optimizer: str = "adam") -> None:
    """One training stage as the engine runs it: a growth step first (from stage 2), then training."""
    trainer = small_trainer(stage, optimizer)
    torch.manual_seed(stage)
    if stage > 1 and learner.grows:
        learner.grow(val, trainer)
        learner.architecture_changed()
    report = learner.fit(train, val, trainer)
    _expect(
        report.flops > 0 and report.steps > 0,
        f"{learner.name}: a stage reports {report.flops} FLOPs in {report.steps} steps",
    )


def _same_answers(a: Learner, b: Learner, x: torch.Tensor, what: str) -> None:
    _expect(
        torch.allclose(a.predict_proba(x), b.predict_proba(x), rtol=0, atol=1e-6), f"{a.name}: {what} answers otherwise"
    )


def check_learner(
    name: str, task: TaskInfo, train: LabeledData, val: LabeledData, config: dict, optimizer: str = "adam"
) -> None:
    """Learner ``name`` (``config``: its ``learner`` keys) on ``task``: the whole contract, two stages."""

    def make(seed: int) -> Learner:
        return build_learner(name, task, learner_config({**config}, name=name), seed)

    learner = make(0)
    if task.awaits_statistics:
        learner.take_input_statistics(train.x)
    _expect(
        learner.num_parameters() == sum(p.numel() for p in learner.model.parameters()) > 0,
        f"{name}: parameters miscounted",
    )
    _expect(learner.inference_flops_per_example() > 0, f"{name}: no inference FLOPs counted")
    other = make(1)
    if task.awaits_statistics:
        other.take_input_statistics(train.x)
    _expect(
        not torch.equal(learner.predict_proba(val.x), other.predict_proba(val.x)),
        f"{name}: seeds 0 and 1 give the same model",
    )

    for stage in (1, 2):
        fit_stage(learner, train, val, stage, optimizer)
    proba = learner.predict_proba(val.x)
    _expect(bool(torch.isfinite(proba).all()), f"{name}: probabilities not finite")
    _expect(torch.allclose(proba.sum(-1), torch.ones(len(proba)), atol=1e-4), f"{name}: probabilities do not sum to 1")
    error = learner.evaluate(val)[learner.measure]
    _expect(error == error and error >= 0, f"{name}: its {learner.measure} is {error}")

    rebuilt = learner_from_spec(json.loads(json.dumps(learner.spec())))
    rebuilt.load_state_dict(learner.state_dict())
    _same_answers(learner, rebuilt, val.x, "rebuilt from its spec")
    with tempfile.TemporaryDirectory() as folder:
        store = CheckpointStore(folder, "check")
        store.save(learner, 1, {"val_error": 0.0})
        _same_answers(learner, store.load(1), val.x, "loaded from its checkpoint")

    again = make(0)
    if task.awaits_statistics:
        again.take_input_statistics(train.x)
    for stage in (1, 2):
        fit_stage(again, train, val, stage, optimizer)
    a, b = learner.state_dict(), again.state_dict()
    _expect(
        a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a),
        f"{name}: one seed on one data trains two models",
    )


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

    Raises :class:`ModelCheckError` (or the one-line ``ConfigError`` the daemon would stop with).
    """
    data = as_labeled(data, task)
    cut = max(1, len(data) * 3 // 4)
    train, val = data.subset(torch.arange(cut)), data.subset(torch.arange(cut, len(data)))
    for name in learners:
        shared = {"model": model, "members": 2} if name in ("ens", "umix") else {"model": model}
        check_learner(name, task, train, val, shared, optimizer)
    check_deployed_weights(model, task, train, [n for n in learners if n != "gmoe"], init_weights)


def as_labeled(data: LabeledData | tuple[ArrayLike, ArrayLike], task: TaskInfo) -> LabeledData:
    """``data`` as tensors: features as float32 (uint8 pixels kept), labels as int64 (a regression's as float32)."""
    raw_x, raw_y = (data.x, data.y) if isinstance(data, LabeledData) else data
    x = raw_x if isinstance(raw_x, torch.Tensor) else torch.as_tensor(np.asarray(raw_x))
    y = raw_y if isinstance(raw_y, torch.Tensor) else torch.as_tensor(np.asarray(raw_y))
    if x.dtype != torch.uint8 or not task.pixels:
        x = x.float()
    y = y.float() if task.regression else y.long()
    return LabeledData(x, y)


def check_deployed_weights(
    model: str, task: TaskInfo, data: LabeledData, learners: Iterable[str], init_weights: str | None = None
) -> None:
    """Every learner in ``learners`` started from the deployed weights (the file ``init_weights``, else a
    factory module's saved weights) answers as the factory's module holding those weights."""
    deployed = import_factory(model)(task).eval()
    with tempfile.TemporaryDirectory() as folder:
        path = init_weights or f"{folder}/deployed.safetensors"
        if init_weights is None:
            save_file({k: v.contiguous() for k, v in deployed.state_dict().items()}, path)
        else:
            weights = load_file(init_weights)
            _expect(
                weights.keys() == deployed.state_dict().keys(),
                f"{init_weights}: its keys are not those of {model}'s module "
                f"({sorted(weights.keys() ^ deployed.state_dict().keys())[:4]} differ)",
            )
            deployed.load_state_dict(weights)
        for name in learners:
            learner = build_learner(name, task, learner_config({"model": model, "init_weights": path}, name=name), 0)
            if task.awaits_statistics:
                learner.take_input_statistics(data.x)
            learner.start_from(load_file(path), path)
            normalize = next(m for m in learner.model.modules() if isinstance(m, Normalize))
            with torch.no_grad():
                expected = deployed(normalize(data.x)).softmax(1)
            _expect(
                torch.allclose(learner.predict_proba(data.x), expected, rtol=0, atol=1e-5),
                f"{name}: started from the deployed weights, it answers otherwise than the deployed module",
            )
