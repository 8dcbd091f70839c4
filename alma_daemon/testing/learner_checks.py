"""The learner contract as named checks (River's ``yield_checks`` is the model).

:func:`yield_learner_checks` yields every check of one learner on one task's data; :func:`check_learner`
runs them all. tests/test_learner_contract.py runs each as its own test on every built-in learner and
each of its ``contract_cases()``, so the checks a team runs on its model are exactly the project's.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Iterator, Mapping
from functools import cached_property, partial
from typing import Any

import torch

from alma_daemon.config import TrainConfig, learner_config
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import Learner, build_learner, learner_class, learner_from_spec
from alma_daemon.learners.growing import AT_SIZE_CAP, GrowsOnceTrained
from alma_daemon.testing.checks import Check, answers_alike, expect, run_checks
from alma_daemon.training.loop import FitReport, Trainer

#: The stages a checked learner trains: the second grows it first, where it grows.
STAGES = (1, 2)
#: The most stages a capped learner trains to reach its cap (it may grow less than it may at a step).
CAPPED_STAGES = 4


def small_trainer(stage: int, optimizer: str, augment: bool) -> Trainer:
    """A trainer of two short epochs: enough to move the weights, quick on a CPU."""
    config = TrainConfig(epochs=2, patience=1, batch_size=32, steps_per_chunk=4, warmup_steps=1)
    return Trainer(config, optimizer, torch.device("cpu"), seed=stage, augment=augment)


def fit_stage(learner: Learner, train: LabeledData, val: LabeledData, stage: int, optimizer: str = "adam") -> FitReport:
    """One training stage as the engine runs it: a growth step first (from stage 2), then training,
    augmented where the task asks for it."""
    trainer = small_trainer(stage, optimizer, learner.task.augment)
    torch.manual_seed(stage)
    if stage > 1 and learner.grows:
        learner.grow(val, trainer)
        learner.architecture_changed()
    return learner.fit(train, val, trainer)


class LearnerUnderCheck:
    """One learner on one task's data, as its checks share it: built afresh, or trained through
    :data:`STAGES` once, on first use; the checks read the trained learner and never change it."""

    def __init__(
        self, name: str, task: TaskInfo, train: LabeledData, val: LabeledData, keys: Mapping[str, Any], optimizer: str
    ):
        self.name = name
        self.task = task
        self.train = train
        self.val = val
        self.keys = dict(keys)
        self.optimizer = optimizer

    def fresh(self, seed: int = 0) -> Learner:
        """The learner as the engine builds it, holding the statistics of its first chunk (``train``)."""
        learner = build_learner(self.name, self.task, learner_config(dict(self.keys), name=self.name), seed)
        if learner.awaits_statistics:
            learner.take_statistics(self.train)
        return learner

    def train_fresh(self) -> tuple[Learner, list[FitReport]]:
        """A fresh learner trained through :data:`STAGES`, and its stages' reports."""
        learner = self.fresh()
        return learner, [fit_stage(learner, self.train, self.val, stage, self.optimizer) for stage in STAGES]

    @cached_property
    def training(self) -> tuple[Learner, list[FitReport]]:
        """:meth:`train_fresh`, once: the trained learner the checks read, and its stages' reports."""
        return self.train_fresh()

    @property
    def trained(self) -> Learner:
        return self.training[0]


def same_answers(case: LearnerUnderCheck, other: Learner, what: str) -> None:
    expected, answered = case.trained.predict_outputs(case.val.x), other.predict_outputs(case.val.x)
    expect(answers_alike(expected, answered), f"{case.name}: {what}, it answers otherwise")


# -- checks of a learner before and after training, whatever its task ---------------------------
def counts_its_parameters(case: LearnerUnderCheck) -> None:
    learner = case.fresh()
    held = sum(p.numel() for p in learner.model.parameters())
    expect(
        learner.num_parameters() == held > 0,
        f"{case.name}: counts {learner.num_parameters()} parameters; its modules hold {held}",
    )


def counts_its_inference_flops(case: LearnerUnderCheck) -> None:
    for learner, when in ((case.fresh(), "built"), (case.trained, "trained")):
        flops = learner.inference_flops_per_example()
        expect(flops > 0, f"{case.name}: {when}, it counts {flops} FLOPs per prediction")


def seeds_give_different_models(case: LearnerUnderCheck) -> None:
    first, second = (case.fresh(seed).predict_outputs(case.val.x) for seed in (0, 1))
    expect(not torch.equal(first, second), f"{case.name}: seeds 0 and 1 give the same model")


def reinitializing_changes_the_weights_only(case: LearnerUnderCheck) -> None:
    learner = case.fresh()
    before, count = learner.predict_outputs(case.val.x), learner.num_parameters()
    learner.reinitialize(1234)
    expect(
        learner.num_parameters() == count,
        f"{case.name}: reinitialized, it holds {learner.num_parameters()} parameters, not {count}",
    )
    expect(
        not torch.equal(before, learner.predict_outputs(case.val.x)), f"{case.name}: reinitialized, it answers the same"
    )


def stages_report_their_cost(case: LearnerUnderCheck) -> None:
    for stage, report in zip(STAGES, case.training[1]):
        expect(
            report.flops > 0 and report.steps > 0 and report.seconds > 0,
            f"{case.name}: stage {stage} reports {report.flops} FLOPs, {report.steps} steps, {report.seconds} s",
        )


def measured_answers_are_its_predictions(case: LearnerUnderCheck) -> None:
    # The engine measures through outputs() (a data set standardized once), serving through predict_outputs().
    learner = case.trained
    measured, predicted = learner.outputs(case.val), learner.predict_outputs(case.val.x)
    expect(
        answers_alike(measured, predicted),
        f"{case.name}: the answers it is measured on are not those it predicts",
    )


def measures_itself(case: LearnerUnderCheck) -> None:
    learner = case.trained
    value = learner.evaluate(case.val)[learner.measure]
    expect(math.isfinite(value), f"{case.name}: its {learner.measure} is {value}")


def spec_rebuilds_the_same_answers(case: LearnerUnderCheck) -> None:
    spec = json.loads(json.dumps(case.trained.spec()))
    rebuilt = learner_from_spec(spec)
    expect(
        json.loads(json.dumps(rebuilt.spec())) == spec,
        f"{case.name}: rebuilt from its spec, it describes itself otherwise",
    )
    rebuilt.load_state_dict(case.trained.state_dict())
    same_answers(case, rebuilt, "rebuilt from its spec")


def checkpoint_rebuilds_the_same_answers(case: LearnerUnderCheck) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = CheckpointStore(folder, "check")
        store.save(case.trained, 1, {"val_error": 0.0})
        same_answers(case, store.load(1), "loaded from its checkpoint")


def one_seed_trains_one_model(case: LearnerUnderCheck) -> None:
    again, _ = case.train_fresh()
    first, second = case.trained.state_dict(), again.state_dict()
    expect(
        first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first),
        f"{case.name}: one seed on the same data trains two different models",
    )


# -- checks of a classifier's or a language model's answers: probabilities -----------------------
def answers_a_probability_per_class(case: LearnerUnderCheck) -> None:
    proba = case.trained.predict_proba(case.val.x)
    expect(
        proba.shape[0] == len(case.val) and proba.shape[-1] == case.task.num_classes,
        f"{case.name}: answers {tuple(proba.shape)} for {len(case.val)} examples of {case.task.num_classes} classes",
    )


def probabilities_are_between_0_and_1(case: LearnerUnderCheck) -> None:
    proba = case.trained.predict_proba(case.val.x)
    expect(bool(((proba >= 0) & (proba <= 1)).all()), f"{case.name}: probabilities outside [0, 1] (or NaN)")


def probabilities_sum_to_one(case: LearnerUnderCheck) -> None:
    proba = case.trained.predict_proba(case.val.x)
    expect(
        torch.allclose(proba.sum(-1), torch.ones(proba.shape[:-1]), rtol=0, atol=1e-4),
        f"{case.name}: probabilities do not sum to 1",
    )


# -- checks of a regression's answers: numbers in the target's units -----------------------------
def answers_one_number_per_example(case: LearnerUnderCheck) -> None:
    answers = case.trained.predict_outputs(case.val.x)
    expect(
        answers.shape == (len(case.val),) and answers.dtype == torch.float32,
        f"{case.name}: answers {answers.dtype} of shape {tuple(answers.shape)} for {len(case.val)} examples",
    )


def numbers_are_finite(case: LearnerUnderCheck) -> None:
    answers = case.trained.predict_outputs(case.val.x)
    expect(bool(torch.isfinite(answers).all()), f"{case.name}: answers NaN or infinite numbers")


# -- checks of a growing learner with a size cap --------------------------------------------------
def stops_growing_at_its_cap(case: LearnerUnderCheck) -> None:
    """Capped one smallest growth above its starting size, it grows to the cap and no further; there a
    growth step is skipped, saying so, and leaves its parameters and inference FLOPs as they are; its
    spec carries the cap."""
    fresh = case.fresh()
    assert isinstance(fresh, GrowsOnceTrained) and fresh.size_cap_key is not None  # as yield_learner_checks picks
    key, cap = fresh.size_cap_key, fresh.grown_size() + fresh.smallest_growth()
    capped = LearnerUnderCheck(case.name, case.task, case.train, case.val, {**case.keys, key: cap}, case.optimizer)
    learner = capped.fresh()
    assert isinstance(learner, GrowsOnceTrained)
    for stage in range(1, CAPPED_STAGES + 1):
        fit_stage(learner, case.train, case.val, stage, case.optimizer)
        expect(learner.grown_size() <= cap, f"{case.name}: grew to {learner.grown_size()}, past learner.{key}: {cap}")
        if learner.at_size_cap:
            break
    expect(learner.at_size_cap, f"{case.name}: {CAPPED_STAGES} stages did not take it to learner.{key}: {cap}")
    parameters, flops = learner.num_parameters(), learner.inference_flops_per_example()
    growth = learner.grow(case.val, small_trainer(CAPPED_STAGES + 1, case.optimizer, case.task.augment))
    learner.architecture_changed()
    expect(
        not growth.grew and AT_SIZE_CAP in str(growth.skipped),
        f"{case.name}: at learner.{key}: {cap}, a growth step reports {growth.as_row()}",
    )
    expect(
        (learner.num_parameters(), learner.inference_flops_per_example()) == (parameters, flops),
        f"{case.name}: at its cap, a growth step changed its parameters or inference FLOPs",
    )
    expect(
        learner_from_spec(json.loads(json.dumps(learner.spec()))).at_size_cap,
        f"{case.name}: rebuilt from its spec, it is no longer at its cap",
    )


CheckFunction = Callable[[LearnerUnderCheck], None]

#: Checks of every learner, in the order they run: a built learner's first, then a trained one's.
EVERY_TASK: tuple[CheckFunction, ...] = (
    counts_its_parameters,
    seeds_give_different_models,
    reinitializing_changes_the_weights_only,
    counts_its_inference_flops,
    stages_report_their_cost,
    measured_answers_are_its_predictions,
    measures_itself,
    spec_rebuilds_the_same_answers,
    checkpoint_rebuilds_the_same_answers,
)
PROBABILITIES: tuple[CheckFunction, ...] = (
    answers_a_probability_per_class,
    probabilities_are_between_0_and_1,
    probabilities_sum_to_one,
)
#: Checks of the answers, by task kind (``TaskInfo.kind``).
ANSWERS: dict[str, tuple[CheckFunction, ...]] = {
    "classification": PROBABILITIES,
    "language_model": PROBABILITIES,
    "regression": (answers_one_number_per_example, numbers_are_finite),
}
#: Checks that train the learner again from scratch.
RETRAINING: tuple[CheckFunction, ...] = (one_seed_trains_one_model,)
#: Checks of a growing learner that takes a size cap (:attr:`GrowsOnceTrained.size_cap_key`); they train
#: a capped learner from scratch, too.
CAPPED: tuple[CheckFunction, ...] = (stops_growing_at_its_cap,)


def yield_learner_checks(
    name: str,
    task: TaskInfo,
    train: LabeledData,
    val: LabeledData,
    keys: Mapping[str, Any] | None = None,
    optimizer: str = "adam",
) -> Iterator[Check]:
    """Every check of learner ``name`` (``keys``: its ``learner`` section) on ``task``: trained on ``train``
    for two stages with ``optimizer`` (growing before the second), answering for ``val``. The checks
    share one trained learner, trained when the first check needs it; a growing learner with a size cap
    is also trained capped."""
    case = LearnerUnderCheck(name, task, train, val, keys or {}, optimizer)
    for check in (*EVERY_TASK, *ANSWERS[task.kind]):
        yield Check(check.__name__, partial(check, case))
    for check in RETRAINING:
        yield Check(check.__name__, partial(check, case), slow=True)
    learner = learner_class(name)
    if issubclass(learner, GrowsOnceTrained) and learner.size_cap_key is not None:
        for check in CAPPED:
            yield Check(check.__name__, partial(check, case), slow=True)


def check_learner(
    name: str,
    task: TaskInfo,
    train: LabeledData,
    val: LabeledData,
    keys: Mapping[str, Any] | None = None,
    optimizer: str = "adam",
) -> None:
    """Run every check of :func:`yield_learner_checks`: the first that fails raises ContractError."""
    run_checks(yield_learner_checks(name, task, train, val, keys, optimizer))
