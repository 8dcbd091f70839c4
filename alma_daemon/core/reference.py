"""The reference learner: a cheap linear model trained prequentially on the same stream as the network,
so that a team sees at once when its network is behind a linear model (``reference.kind``,
docs/results.md#the-reference-learner).

On flat numeric features (a table, a River stream, arrays of one axis) it is River's
``StandardScaler | LogisticRegression`` for two classes, ``StandardScaler |
OneVsRestClassifier(LogisticRegression)`` for more (it has intercepts, which ``SoftmaxRegression``
lacks, so it learns the classes' frequencies; and it predicts a whole sample at once), and
``StandardScaler | LinearRegression`` for a regression. Images and text have none: per-example dicts
of 784 to 3072 pixels make River slow, and a linear model on pixels says little of a network.

Each chunk, :class:`ReferenceLearner` is measured on the sample the network is measured on, before
it learns, with the task's own measure; then it learns every example of the chunk, one at a time.
River's mini-batch ``learn_many`` takes one mean-gradient step per call, so a chunk learnt in one call
is one step; the batches small enough to learn from cost more calls than the loop (1.7 s against
0.7 s for 30,000 rows of 12 features). Predictions use ``predict_proba_many`` on a pandas frame.

Its state (the scaler's counts, means and variances; each linear model's weights, intercept and
optimizer steps) is JSON in :class:`~alma_daemon.core.engine_state.EngineState`, never a pickle:
the daemon rebuilds the reference from it after a restart, predicting and learning as the one it
left.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from alma_daemon.core.reference_fit import resolved_kind, unfit_reason
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.measures import Measure, task_measure

log = logging.getLogger(__name__)

#: The version of :meth:`ReferenceLearner.state_dict`'s layout.
STATE_VERSION = 1
#: River's default learning rate of its linear models' SGD.
DEFAULT_LR = 0.01


def build_reference(kind: str, task: TaskInfo, state: dict[str, Any] | None = None) -> ReferenceLearner | None:
    """The reference ``reference.kind`` asks for on ``task`` (None: none), continued from its saved
    ``state`` (:meth:`ReferenceLearner.state_dict`) where there is one."""
    if resolved_kind(kind, task) == "none":
        if kind == "auto":
            log.info("no reference learner", extra={"reason": unfit_reason(task) or "wide features or no River"})
        return None
    reference = ReferenceLearner(task)
    if state:
        reference.load_state_dict(state)
    return reference


class ReferenceLearner:
    """River's linear model of ``task``'s kind, measured with the task's measure before it learns."""

    def __init__(self, task: TaskInfo):
        why = unfit_reason(task)
        if why is not None:
            raise ValueError(f"a linear reference {why}")
        from river import linear_model, multiclass, optim, preprocessing  # the river extra: only where used

        self.task = task
        self.kind = task.target_kind
        self.features = int(task.input_shape[0])
        self.names = [f"x{i}" for i in range(self.features)]
        self.measure: Measure = task_measure(task)
        #: Examples learnt so far.
        self.examples = 0
        self.scaler = preprocessing.StandardScaler()
        self.model: Any
        if self.kind == "binary":
            self.model = linear_model.LogisticRegression()
        elif self.kind == "multiclass":
            self.model = multiclass.OneVsRestClassifier(linear_model.LogisticRegression())
        else:
            # SGD on the squared loss diverges once lr * |x|^2 passes 2, and |x|^2 is about the number of
            # standardized features: River's 0.01 does to 50 of them, a smaller rate beyond.
            self.learning_rate = min(DEFAULT_LR, 0.5 / self.features)
            self.model = linear_model.LinearRegression(optimizer=optim.SGD(self.learning_rate))
        self.pipeline = self.scaler | self.model

    @property
    def description(self) -> str:
        """``StandardScaler | LogisticRegression``: River's pipeline, as River names it."""
        return str(self.pipeline)

    # -- the stream -----------------------------------------------------------------------------------
    def assess(self, data: LabeledData) -> float:
        """The task's measure of the reference on ``data``, which it has not learnt yet."""
        return self.measure.measure(self.outputs(data.x), data.y).value

    def outputs(self, x: torch.Tensor) -> torch.Tensor:
        """Class probabilities (N x C, float64), or a regression's predictions (N)."""
        import pandas as pd

        frame = pd.DataFrame(self._matrix(x), columns=self.names)
        if self.kind == "regression":
            # A copy: pandas may hand back a read-only view, which torch warns of.
            return torch.from_numpy(np.array(self.pipeline.predict_many(frame), dtype=np.float64))
        probabilities = self.pipeline.predict_proba_many(frame)
        if self.kind == "binary":
            positive = np.asarray(probabilities[True], dtype=np.float64)
            return torch.from_numpy(np.stack([1.0 - positive, positive], axis=1))
        out = np.zeros((len(frame), self.task.num_classes))
        for label in probabilities.columns:
            out[:, int(label)] = probabilities[label].to_numpy(dtype=np.float64)
        if not len(probabilities.columns):  # no class learnt yet
            out[:] = 1.0 / self.task.num_classes
        return torch.from_numpy(out)

    def learn(self, data: LabeledData) -> None:
        """Learn ``data``'s examples: the scaler's statistics all at once (River's mini-batch update is
        exact), then the linear model one example at a time, in their order (see the module's doc)."""
        import pandas as pd

        frame = pd.DataFrame(self._matrix(data.x), columns=self.names)
        self.scaler.learn_many(frame)
        scaled = self.scaler.transform_many(frame).to_numpy(dtype=np.float64).tolist()
        names, learn, weights = self.names, self.model.learn_one, self.task.class_weights
        for row, label in zip(scaled, data.y.tolist(), strict=True):
            if weights:  # the task's loss weights (task.class_weights), as the network learns with them
                learn(dict(zip(names, row, strict=True)), self._label(label), w=weights[int(label)])
            else:
                learn(dict(zip(names, row, strict=True)), self._label(label))
        self.examples += len(data)

    def _label(self, label: float) -> Any:
        if self.kind == "binary":
            return label == 1
        if self.kind == "multiclass":
            return int(label)
        return float(label)

    def _matrix(self, x: torch.Tensor) -> np.ndarray:
        return x.reshape(len(x), -1).double().numpy()

    # -- its state, as JSON -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What :meth:`load_state_dict` continues from: plain JSON data (floats kept exactly)."""
        scaler = self.scaler
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "kind": self.kind,
            "features": self.features,
            "model": self.description,
            "examples": self.examples,
            "scaler": {"counts": dict(scaler.counts), "means": dict(scaler.means), "vars": dict(scaler.vars)},
        }
        if self.kind == "multiclass":
            # In the order the classes were first met: OneVsRest normalizes over them in that order.
            state["classes"] = [[label, _linear_state(model)] for label, model in self.model.classifiers.items()]
        else:
            state["linear"] = _linear_state(self.model)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s ``state``, refused where it is another task's."""
        mine = (STATE_VERSION, self.kind, self.features)
        theirs = (state.get("version"), state.get("kind"), state.get("features"))
        if theirs != mine:
            raise ValueError(f"the saved reference is of version, task kind and features {theirs}, this task's {mine}")
        saved = state["scaler"]
        self.scaler.counts.update(saved["counts"])
        self.scaler.means.update(saved["means"])
        self.scaler.vars.update(saved["vars"])
        if self.kind == "multiclass":
            self.model.classifiers = {
                int(label): _load_linear(self.model.classifier.clone(), saved_model)
                for label, saved_model in state["classes"]
            }
        else:
            _load_linear(self.model, state["linear"])
        self.examples = int(state["examples"])


def _linear_state(model: Any) -> dict[str, Any]:
    """A River GLM's learnt state: its weights (in their order), intercept and optimizer steps (which a
    learning-rate schedule reads)."""
    return {
        "weights": model._weights.to_dict(),
        "intercept": model.intercept,
        "steps": model.optimizer.n_iterations,
    }


def _load_linear(model: Any, state: dict[str, Any]) -> Any:
    from river import utils

    model._weights = utils.VectorDict({name: float(w) for name, w in state["weights"].items()})
    model.intercept = float(state["intercept"])
    model.optimizer.n_iterations = int(state["steps"])
    return model
