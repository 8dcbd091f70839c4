"""The learner contract as functions: each check raises :class:`ModelCheckError` naming what failed."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable

import torch
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
    data: LabeledData,
    learners: Iterable[str] = MODEL_LEARNERS,
    optimizer: str = "adam",
) -> None:
    """Run the contract of every learner in ``learners`` on ``learner.model = model`` and ``data`` (a few
    hundred labeled examples of the team's), then start each from the weights of the factory's module.

    Raises :class:`ModelCheckError` (or the one-line ``ConfigError`` the daemon would stop with).
    """
    cut = max(1, len(data) * 3 // 4)
    train, val = data.subset(torch.arange(cut)), data.subset(torch.arange(cut, len(data)))
    for name in learners:
        shared = {"model": model, "members": 2} if name in ("ens", "umix") else {"model": model}
        check_learner(name, task, train, val, shared, optimizer)
    check_deployed_weights(model, task, train, [n for n in learners if n != "gmoe"])


def check_deployed_weights(model: str, task: TaskInfo, data: LabeledData, learners: Iterable[str]) -> None:
    """Every learner in ``learners`` started from a factory module's saved weights answers as that module."""
    deployed = import_factory(model)(task).eval()
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/deployed.safetensors"
        save_file({k: v.contiguous() for k, v in deployed.state_dict().items()}, path)
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
