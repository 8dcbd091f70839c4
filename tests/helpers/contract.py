"""The learner contract's tasks, data and training steps (also used by ``tests/ranks_worker.py``)."""

from __future__ import annotations

import torch

from alma_daemon.config import TrainConfig
from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import build_learner
from alma_daemon.training.loop import Trainer
from tests.helpers.configs import learner_settings
from tests.helpers.data import separable_data

CIFAR_LIKE = TaskInfo(
    "classification", (32, 32, 3), 4, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), channels_last=True, augment=True
)


TOKENS = TaskInfo("language_model", (16,), 50, extra={"vocab_size": 50})


def token_data(n: int, seed: int) -> LabeledData:
    """Sequences of a repeating pattern, so next-token prediction is learnable."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, 50, (n, 1), generator=g)
    seq = (start + torch.arange(17)) % 50
    return LabeledData(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


TASKS = {
    "mlp": (MNIST_TASK, lambda n, seed: separable_data(MNIST_TASK, n, seed), 256),
    "vgg": (CIFAR_LIKE, lambda n, seed: separable_data(CIFAR_LIKE, n, seed), 64),
    "tokens": (TOKENS, token_data, 64),
}


OPTIMIZER = {"mlp": "adadelta", "vgg": "sgd", "tokens": "adam"}


def make(name: str, task_name: str, overrides: dict, seed: int = 0):
    task, data_fn, n = TASKS[task_name]
    config = learner_settings(name, {"width": 8, "members": 2}, overrides)
    learner = build_learner(name, task, config, seed)
    train, val = data_fn(n, seed=1), data_fn(n // 4, seed=2)
    return learner, train, val


def trainer(task_name: str, stage: int = 1) -> Trainer:
    config = TrainConfig(epochs=2, patience=1, batch_size=32, steps_per_chunk=4, warmup_steps=1)
    return Trainer(config, OPTIMIZER[task_name], torch.device("cpu"), seed=stage, augment=task_name == "vgg")


def fit_stage(learner, train, val, task_name, stage=1, grow=False):
    t = trainer(task_name, stage)
    torch.manual_seed(stage)
    if grow and learner.grows:
        learner.grow(val, t)
        learner.architecture_changed()
    return learner.fit(train, val, t)
