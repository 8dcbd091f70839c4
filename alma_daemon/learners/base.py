"""The learner interface (adding a learner: docs/architecture.md).

A learner owns one ``nn.Module`` (``self.model``) holding every parameter, so checkpoints are one
state dict. Subclasses implement :meth:`build` (the architecture), :meth:`fit` (what to hand to the
shared :class:`~alma_daemon.training.loop.Trainer`, with the task's loss: :attr:`Learner.training_loss`),
:meth:`forward_proba` (a classifier's answer) and, where it learns a regression, :meth:`forward_prediction`;
growing learners also override :meth:`initial_architecture` and take their growth step from
:class:`~alma_daemon.learners.growing.GrowsOnceTrained` (``grow_trained``). Everything else has a default.
"""

from __future__ import annotations

import dataclasses
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar, TypeVar

import torch
from torch import nn

from alma_daemon.config import ConfigError, LearnerConfig, validate
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners.configs import BackboneConfig
from alma_daemon.learners.growth_report import GrowthReport
from alma_daemon.measures import Measure, Measurement, task_measure
from alma_daemon.measures.decision import calibrated
from alma_daemon.models.backbones import Backbone, Normalize, backbone_layers, inputs_standardized_outside
from alma_daemon.models.user_model import load_user_weights, user_layers
from alma_daemon.seeding import derive_seed
from alma_daemon.training.flops import count_flops
from alma_daemon.training.loop import EVAL_BATCH, FitReport, Trainer
from alma_daemon.training.losses import TaskLoss, task_loss

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def network_layers(task: TaskInfo, config: BackboneConfig) -> list[nn.Module]:
    """The layers of one network: the factory's of ``learner.model``, else the paper's backbone's."""
    return user_layers(task, config.model) if config.model else backbone_layers(task, config.width)


def build_network(task: TaskInfo, config: BackboneConfig) -> Backbone:
    """One network of a backbone learner (an SM model, an ensemble's member), from raw inputs to logits."""
    return Backbone(task, network_layers(task, config))


def seeded_build(seed: int, build: Any) -> Any:
    """Call ``build()`` with torch's global RNG seeded, without disturbing the caller's RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def seeded_members(learner: Learner, indices: range, build: Callable[[], ModuleT]) -> list[ModuleT]:
    """The ensembles' members (image and language), each initialized from its own seed (its index).

    Members differ from each other, and a member added by a growth step is rebuilt identically when a
    checkpoint is loaded, whatever the order members were created in.
    """
    return [seeded_build(derive_seed(learner.build_seed, "member", i), build) for i in indices]


class Learner(ABC):
    """A model that learns from a stream of chunks: fit, predict, count, describe itself."""

    #: Name in config (``learner.name``) and in checkpoints' spec.json.
    name: ClassVar[str]
    #: The ``learner`` section this learner reads, declared next to it; its ``name`` is ``Literal[name]``.
    config_model: ClassVar[type[LearnerConfig]]
    #: True for learners whose :meth:`grow` changes the architecture.
    grows: ClassVar[bool] = False
    #: True where a growth step leaves the function the model computes unchanged (gMoE's split, the
    #: Switch LM's copied expert) or moves it by a small scored step (Firefly), False where it adds an
    #: untrained part (gEns); the adaptive policy grows the former at every stage.
    growth_keeps_function: ClassVar[bool] = False
    #: True where one network trains data-parallel under torchrun (every batch split over the ranks);
    #: False where independent members train one per rank.
    splits_batches_over_ranks: ClassVar[bool] = False
    #: The task kinds (``TaskInfo.kind``) the learner learns; another is refused when it is built.
    task_kinds: ClassVar[tuple[str, ...]] = ("classification", "regression")
    #: The architecture of the learner's linear form, a linear model of the inputs that a stage trains beside
    #: the network under ``train.linear_candidate``; None: the learner has none.
    linear_architecture: ClassVar[dict[str, Any] | None] = None

    def __init__(self, task: TaskInfo, config: LearnerConfig, seed: int, arch: dict[str, Any] | None = None):
        # torch imports its compiler stack (over a second) when the first FLOP counter or optimizer is
        # made; importing it with the learner keeps that cost out of the first chunk of a stream.
        import torch._dynamo  # noqa: F401

        if task.kind not in self.task_kinds:
            raise ConfigError(
                f"learner.name: {self.name} cannot learn a {task.kind.replace('_', ' ')} task; {learners_of(task.kind)}"
            )
        self.task = task
        self.config = config
        self.seed = seed
        self.arch = dict(arch) if arch is not None else self.initial_architecture()
        #: Seed of the current weights' initialization (changes when retraining from scratch).
        self.build_seed = seed
        self.model: nn.Module = seeded_build(seed, lambda: self.build(self.arch))
        self._inference_flops: float | None = None
        self._standardized_inputs: dict[tuple[int, torch.device], torch.Tensor] = {}

    # -- what subclasses provide ------------------------------------------------------------------
    def initial_architecture(self) -> dict[str, Any]:
        """The JSON description of the architecture before any growth."""
        return {}

    @abstractmethod
    def build(self, arch: dict[str, Any]) -> nn.Module:
        """Create the module for ``arch`` (called under torch's RNG seeded with ``self.build_seed``)."""

    @abstractmethod
    def fit(self, train: LabeledData, val: LabeledData, trainer: Trainer) -> FitReport:
        """Train on a stage's data (fine-tuning from the current parameters)."""

    @abstractmethod
    def forward_proba(self, x: torch.Tensor) -> torch.Tensor:
        """A classifier's class probabilities for a batch of raw inputs (already on the model's device)."""

    def forward_prediction(self, x: torch.Tensor) -> torch.Tensor:
        """A regression's standardized prediction for a batch of raw inputs (on the model's device): the
        networks' one output (N x 1), before :attr:`training_loss` puts it in the target's units."""
        raise NotImplementedError(f"learner {self.name!r} does not learn a regression")

    @classmethod
    def contract_cases(cls) -> list[tuple[str, dict[str, Any]]]:
        """(task name, learner config overrides) pairs the shared contract test runs this learner on: at
        least one for each kind of :attr:`task_kinds`.

        Task names are defined in tests/helpers/contract.py: "mlp" (MNIST-shaped images), "vgg"
        (CIFAR-shaped images), "tokens" (a small language-modeling task) and "regression" (five features).
        """
        return [("mlp", {}), ("vgg", {"width": 4}), ("regression", {})]

    def grow(self, val: LabeledData, trainer: Trainer) -> GrowthReport:
        """Grow the architecture before a training stage; returns what grew and what choosing it cost."""
        raise NotImplementedError(f"learner {self.name!r} does not grow")

    @property
    def at_size_cap(self) -> bool:
        """Whether a growing learner has reached its size cap (``learner.max_members``, ...): its growth
        steps are skipped and its stages fine-tune, so its parameters and inference FLOPs stay as they
        are. False for a learner that does not grow, or has no cap."""
        return False

    # -- shared behaviour -------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        for p in self.model.parameters():
            return p.device
        return torch.device("cpu")

    def to(self, device: torch.device | str) -> Learner:
        self.model.to(device)
        return self

    def reinitialize(self, seed: int) -> None:
        """Fresh random weights for the current architecture (retraining from scratch)."""
        device = self.device
        self.build_seed = seed
        self.model = seeded_build(seed, lambda: self.build(self.arch)).to(device)

    def rebuild(self, arch: dict[str, Any], seed: int) -> None:
        """Fresh random weights for architecture ``arch`` (a stage's candidate of another form)."""
        self.arch = dict(arch)
        self.reinitialize(seed)
        self.architecture_changed()

    @property
    def is_linear(self) -> bool:
        """Whether the learner holds its linear form (:attr:`linear_architecture`) now."""
        return self.linear_architecture is not None and self.arch == self.linear_architecture

    def start_from(self, state: dict[str, torch.Tensor], source: str) -> None:
        """Load a deployed model's weights (``learner.init_weights``): a checkpoint's of this learner and
        architecture (a version's weights.safetensors in a model store), or ``learner.model``'s module's,
        into every network built so far: SM's one, each member of an ensemble or a uniform mixture,
        gEns's first member."""
        if state.keys() == self.model.state_dict().keys():
            self.load_state_dict(state)
            return
        networks = [m for m in self.model.modules() if isinstance(m, Backbone)]
        if not networks:
            raise ConfigError(f"learner.init_weights: learner {self.name!r} has no network built by learner.model")
        for net in networks:
            load_user_weights(net, state, source)
        if self.task.regression:
            # The deployed network answers in the target's units: it goes on learning them as they are.
            self.task = replace(self.task, target_mean=0.0, target_std=1.0)

    @property
    def awaits_statistics(self) -> bool:
        """Whether the task still awaits statistics of the stream's first chunk (features or target)."""
        return self.task.awaits_statistics or self.task.awaits_target_statistics

    def take_statistics(self, data: LabeledData) -> None:
        """Take the statistics the task awaits from ``data`` (the stream's first chunk): the features'
        (:meth:`take_input_statistics`), a regression target's (its networks learn it standardized)."""
        if self.task.awaits_statistics:
            self.take_input_statistics(data.x)
        if self.task.awaits_target_statistics:
            self.task = self.task.with_target_statistics(data.y)

    def take_input_statistics(self, x: torch.Tensor) -> None:
        """Standardize inputs with the per-feature statistics of ``x`` (a standardizing task's first chunk):
        they go into the task, hence the spec, and into every :class:`Normalize` of the model."""
        self.task = self.task.with_statistics(x)
        for module in self.model.modules():
            if isinstance(module, Normalize):
                module.set_statistics(self.task)
        self._standardized_inputs.clear()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def training_loss(self) -> TaskLoss:
        """The loss the task's networks train and early-stop on (alma_daemon/training/losses.py)."""
        return task_loss(self.task)

    def forward_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """What the model answers for a batch of raw inputs (on the model's device): class probabilities
        (N x C) for a classifier, predictions (N) in the target's units for a regression."""
        if self.task.regression:
            return self.training_loss.answers(self.forward_prediction(x))
        if self.task.calibration is not None:
            return calibrated(self.forward_proba(x), self.task.calibration, self.task.positive)
        return self.forward_proba(x)

    def _no_outputs(self) -> torch.Tensor:
        """The answers for no examples."""
        return torch.empty(0) if self.task.regression else torch.empty(0, self.task.num_classes)

    def predict_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward_outputs` for raw inputs of any count, evaluated in batches; returned on the CPU."""
        self.model.eval()
        out = []
        with torch.inference_mode():
            for i in range(0, len(x), EVAL_BATCH):
                out.append(self.forward_outputs(x[i : i + EVAL_BATCH].to(self.device)).cpu())
        return torch.cat(out) if out else self._no_outputs()

    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        """A classifier's probabilities for raw inputs of any count (:meth:`predict_outputs`)."""
        if self.task.regression:
            raise TypeError(f"learner {self.name!r} learns a regression: it predicts numbers (predict_outputs)")
        return self.predict_outputs(x)

    @property
    def task_measure(self) -> Measure:
        """The measure the task is judged by (``task.measure``: alma_daemon/measures)."""
        return task_measure(self.task)

    @property
    def measure(self) -> str:
        """The name of :attr:`task_measure`: the unit of every measured field of the records."""
        return self.task_measure.name

    def outputs(self, data: LabeledData) -> torch.Tensor:
        """What the model answers for ``data``'s inputs, on the CPU (:meth:`forward_outputs`). The inputs
        are standardized once per tensor (the test set: once per stream, see :meth:`_standardized`)."""
        self.model.eval()
        out = []
        with inputs_standardized_outside(self.model) as normalize, torch.inference_mode():
            x = data.x if normalize is None else self._standardized(data.x, normalize)
            for i in range(0, len(data), EVAL_BATCH):
                out.append(self.forward_outputs(x[i : i + EVAL_BATCH].to(self.device)).cpu())
        return torch.cat(out) if out else self._no_outputs()

    def measure_on(self, data: LabeledData) -> Measurement:
        """The task's measure of the model on ``data``."""
        return self.task_measure.measure(self.outputs(data), data.y)

    def evaluate(self, data: LabeledData) -> dict[str, float]:
        """``{measure name: value}`` on ``data`` (NaN on no examples)."""
        return {self.measure: self.measure_on(data).value}

    def assess(self, data: LabeledData) -> tuple[Measurement, dict[str, float]]:
        """The task's measure on ``data`` and its other measures (:meth:`Measure.details`), from one pass."""
        measurement, details, _ = self.assess_outputs(data)
        return measurement, details

    def assess_outputs(self, data: LabeledData) -> tuple[Measurement, dict[str, float], torch.Tensor | None]:
        """:meth:`assess` with the outputs both were read from (:meth:`outputs`; None for a learner whose
        measure reads none): the engine bins a binary task's probabilities from the same pass."""
        outputs = self.outputs(data)
        measure = self.task_measure
        return measure.measure(outputs, data.y), measure.details(outputs, data.y), outputs

    def _standardized(self, x: torch.Tensor, normalize: Normalize) -> torch.Tensor:
        """``x`` as the model's layers take it, kept while ``x`` lives: the engine measures one test set
        after every chunk, and standardizing it cost more than the model's forward pass."""
        key = (id(x), self.device)
        if key not in self._standardized_inputs:
            self._standardized_inputs[key] = normalize.arrange(normalize.standardize(x.to(self.device)))
            weakref.finalize(x, self._standardized_inputs.pop, key, None)
        return self._standardized_inputs[key]

    def example_input(self) -> torch.Tensor:
        return torch.zeros((1, *self.task.input_shape), dtype=torch.uint8, device=self.device)

    def inference_flops_per_example(self) -> float:
        """FLOPs of predicting one example with the current architecture (cached until it grows)."""
        if self._inference_flops is None:
            self.model.eval()
            with torch.inference_mode():
                _, flops = count_flops(lambda: self.forward_outputs(self.example_input()))
            self._inference_flops = float(flops)
        return self._inference_flops

    def architecture_changed(self) -> None:
        """Call after growth: cached figures that depend on the architecture are recomputed."""
        self._inference_flops = None

    def spec(self) -> dict[str, Any]:
        """JSON that rebuilds this exact (possibly grown) architecture with :func:`learner_from_spec`."""
        return {
            "learner": self.name,
            "task": self.task.to_dict(),
            "config": dataclasses.asdict(self.config),
            "seed": self.seed,
            "build_seed": self.build_seed,
            "arch": self.arch,
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)


class SingleNetwork(Learner):
    """A learner whose model is one network giving class logits (softmax at the output), or a
    regression's standardized prediction: trained whole on the task's loss.

    Under torchrun the ranks train the network data-parallel (:mod:`alma_daemon.training.data_parallel`).
    """

    splits_batches_over_ranks = True

    def fit(self, train: LabeledData, val: LabeledData, trainer: Trainer) -> FitReport:
        loss = self.training_loss
        return trainer.fit(self.model, train, val, objective=loss.objective, validate=loss.validate, data_parallel=True)

    def forward_proba(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).softmax(1)

    def forward_prediction(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def learners_of(kind: str) -> str:
    """Which registered learners learn a ``kind`` task, as a refusal's advice."""
    from alma_daemon.learners import learner_class, learner_config_models  # the registry imports this module

    names = [name for name in learner_config_models() if kind in learner_class(name).task_kinds]
    return f"use {', '.join(names)}" if names else "no learner does"


def config_from_spec(spec: dict[str, Any], model: type[LearnerConfig]) -> tuple[TaskInfo, LearnerConfig]:
    """The task and learner config saved in a spec.json, read as ``model`` (the spec's learner's).

    No key is dropped: a renamed or unknown key fails, naming it, rather than load its default."""
    config = {**spec["config"], "name": spec["learner"]}
    return TaskInfo.from_dict(spec["task"]), validate(model, config, prefix="spec.config.")
