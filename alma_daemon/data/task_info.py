"""What a model knows of its task (:class:`TaskInfo`), and the tasks the registered image datasets
define; without torch, so that ``alma config check`` can judge a config against its task."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: How a model normalizes its raw inputs: ``pixels`` (0-255 images, the dataset's per-channel
#: statistics), ``standardize`` (per-feature statistics of the stream's first chunk) or ``none``
#: (the model takes the features as they come).
NORMALIZATIONS = ("pixels", "standardize", "none")


#: The target terms of a task that sets none (a paper task): what its spec.json leaves out.
_TARGET_DEFAULTS = {
    "measure": "",
    "classes": [],
    "positive": 1,
    "false_negative_cost": 1.0,
    "false_positive_cost": 1.0,
    "class_weights": [],
    "target_mean": None,
    "target_std": None,
    "decision": "",
    "decision_target": None,
    "calibration": None,
    "threshold": None,
}


def _pair(values: list[float]) -> tuple[float, float]:
    slope, intercept = (float(v) for v in values)
    return slope, intercept


@dataclass(frozen=True)
class TaskInfo:
    """What a model needs to know about its inputs and outputs; saved in every checkpoint's spec."""

    kind: str  # "classification", "regression" or "language_model"
    input_shape: tuple[int, ...]
    #: Classes of a classifier, tokens of a language model; 1 for a regression (one number out).
    num_classes: int
    #: What the model does to raw inputs first (:data:`NORMALIZATIONS`).
    normalization: str = "pixels"
    #: ``pixels``: per-channel mean and std on the [0, 1] scale of 0-255 raw pixels. ``standardize``:
    #: per-feature mean and std in raw units (one value per input value, flattened), taken from the
    #: stream's first chunk (empty until then). ``none``: unused.
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    #: Channel axis of a raw example ("last" for HWC images as stored on the wire).
    channels_last: bool = False
    augment: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    #: The measure the task is judged by (``task.measure``); "" = the kind's default (alma_daemon/measures).
    measure: str = ""
    #: The classes' names in label-index order (``task.classes``); empty = their indexes.
    classes: tuple[str, ...] = ()
    #: A binary task's positive class (``task.positive_class``), by index.
    positive: int = 1
    false_negative_cost: float = 1.0
    false_positive_cost: float = 1.0
    #: A weight per class of the training loss (``task.class_weights``); empty = unweighted.
    class_weights: tuple[float, ...] = ()
    #: A regression's target statistics: networks train on (y - target_mean) / target_std and the
    #: learner answers in the target's units; None until taken from the stream's first chunk.
    target_mean: float | None = None
    target_std: float | None = None
    #: A binary task's decision rule (``task.decision``): "" (the most probable class), cost, precision,
    #: recall or threshold; ``decision_target`` is the precision, recall or threshold it names.
    decision: str = ""
    decision_target: float | None = None
    #: (slope, intercept) mapping the positive class's log-odds to calibrated ones, and the threshold on
    #: the calibrated probability: chosen on the pooled validation set after each stage
    #: (alma_daemon/measures/decision.py), saved with the version.
    calibration: tuple[float, float] | None = None
    threshold: float | None = None
    #: ``standardize``: what the first chunk's statistics do with skewed features (``dataset.skewed_features``):
    #: "power" fits a Yeo-Johnson transform to each (alma_daemon/data/yeo_johnson.py), "keep" leaves them.
    skewed_features: str = "keep"
    #: The Yeo-Johnson lambda of each feature, applied before the mean and std (1.0 = left as it is);
    #: empty = none transformed.
    power: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}; got {self.normalization!r}")

    @property
    def regression(self) -> bool:
        return self.kind == "regression"

    @property
    def target_kind(self) -> str:
        """What the measures call the task: binary, multiclass, regression or language_model."""
        if self.kind == "classification":
            return "binary" if self.num_classes == 2 else "multiclass"
        return self.kind

    @property
    def is_team_task(self) -> bool:
        """A team's task (its own measure, two classes, a regression), as opposed to the paper's balanced
        classes and language models: the stage recipe, the baseline and the reference follow the team's
        terms, while the paper's series stay as published."""
        return (bool(self.measure) or self.target_kind in ("binary", "regression")) and self.kind != "language_model"

    def class_name(self, index: int) -> str:
        """A class's name (``task.classes``), else its index as text."""
        return self.classes[index] if self.classes else str(index)

    def with_statistics(self, x: torch.Tensor) -> TaskInfo:
        """This standardizing task with per-feature statistics of ``x`` (N x input_shape): a feature
        that does not vary keeps a std of 1, so it passes centred instead of dividing by zero. With
        ``skewed_features: power`` the skewed features' Yeo-Johnson lambdas are fitted first and the
        mean and std are those of the transformed features."""
        flat = x.reshape(len(x), -1).double()
        power: tuple[float, ...] = ()
        if self.skewed_features == "power":
            from alma_daemon.data import yeo_johnson

            power = yeo_johnson.fit_lambdas(flat)
            if power:
                flat = yeo_johnson.transform(flat, flat.new_tensor(power))
        mean, std = flat.mean(0), flat.std(0, correction=0)
        std = std.where(std > 1e-6 * (1 + mean.abs()), 1.0)
        return replace(self, mean=tuple(mean.float().tolist()), std=tuple(std.float().tolist()), power=power)

    def with_target_statistics(self, y: torch.Tensor) -> TaskInfo:
        """This regression with the mean and std of targets ``y``; a constant target keeps a std of 1."""
        target = y.double()
        mean, std = float(target.mean()), float(target.std(correction=0))
        return replace(self, target_mean=mean, target_std=std if std > 1e-6 * (1 + abs(mean)) else 1.0)

    @property
    def awaits_target_statistics(self) -> bool:
        """A regression before its first chunk: its target statistics are not known yet."""
        return self.regression and self.target_std is None

    @property
    def pixels(self) -> bool:
        """Raw inputs are pixels in [0, 255] (what the wire and serving check)."""
        return self.normalization == "pixels"

    @property
    def awaits_statistics(self) -> bool:
        """A standardizing task before its first chunk: its statistics are not known yet."""
        return self.normalization == "standardize" and not self.mean

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "normalization": self.normalization,
            "mean": list(self.mean),
            "std": list(self.std),
            "channels_last": self.channels_last,
            "augment": self.augment,
            "extra": self.extra,
            **({"skewed_features": self.skewed_features} if self.skewed_features != "keep" else {}),
            **({"power": list(self.power)} if self.power else {}),
            # The task's own terms, written only where set, so a paper task's spec reads as before.
            **{key: value for key, value in self._target_terms().items() if value != _TARGET_DEFAULTS[key]},
        }

    def _target_terms(self) -> dict[str, Any]:
        return {
            "measure": self.measure,
            "classes": list(self.classes),
            "positive": self.positive,
            "false_negative_cost": self.false_negative_cost,
            "false_positive_cost": self.false_positive_cost,
            "class_weights": list(self.class_weights),
            "target_mean": self.target_mean,
            "target_std": self.target_std,
            "decision": self.decision,
            "decision_target": self.decision_target,
            "calibration": None if self.calibration is None else list(self.calibration),
            "threshold": self.threshold,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskInfo:
        return cls(
            kind=data["kind"],
            input_shape=tuple(data["input_shape"]),
            num_classes=int(data["num_classes"]),
            normalization=str(data.get("normalization", "pixels")),
            mean=tuple(data.get("mean", ())),
            std=tuple(data.get("std", ())),
            channels_last=bool(data.get("channels_last", False)),
            augment=bool(data.get("augment", False)),
            extra=dict(data.get("extra", {})),
            measure=str(data.get("measure", "")),
            classes=tuple(data.get("classes", ())),
            positive=int(data.get("positive", 1)),
            false_negative_cost=float(data.get("false_negative_cost", 1.0)),
            false_positive_cost=float(data.get("false_positive_cost", 1.0)),
            class_weights=tuple(float(w) for w in data.get("class_weights", ())),
            target_mean=None if data.get("target_mean") is None else float(data["target_mean"]),
            target_std=None if data.get("target_std") is None else float(data["target_std"]),
            decision=str(data.get("decision", "")),
            decision_target=None if data.get("decision_target") is None else float(data["decision_target"]),
            calibration=None if data.get("calibration") is None else _pair(data["calibration"]),
            threshold=None if data.get("threshold") is None else float(data["threshold"]),
            skewed_features=str(data.get("skewed_features", "keep")),
            power=tuple(float(v) for v in data.get("power", ())),
        )


MNIST_TASK = TaskInfo("classification", (28, 28), 10, mean=(0.1307,), std=(0.3081,))
# Statistics of the original CIFAR-10 training set (the JPEG-decoded copy differs in the 3rd decimal).
CIFAR10_TASK = TaskInfo(
    "classification",
    (32, 32, 3),
    10,
    mean=(0.4914, 0.4822, 0.4465),
    std=(0.2470, 0.2435, 0.2616),
    channels_last=True,
    augment=True,
)
