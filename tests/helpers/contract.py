"""The tasks and data the learner contract runs on (tests/test_learner_contract.py, ``tests/ranks_worker.py``):
the task names a learner's ``contract_cases()`` declares."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.data.tensors import LabeledData
from tests.helpers.configs import learner_settings
from tests.helpers.data import separable_data

CIFAR_LIKE = TaskInfo(
    "classification", (32, 32, 3), 4, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), channels_last=True, augment=True
)


TOKENS = TaskInfo("language_model", (16,), 50, extra={"vocab_size": 50})

#: A regression on five features, standardized with the first chunk's statistics.
FEATURES = TaskInfo("regression", (5,), 1, normalization="standardize")
WEIGHTS = torch.tensor([1.0, -2.0, 0.5, 3.0, 0.0])

#: The small sizes every contract case starts from (a key its learner does not read is left out).
SIZES = {"width": 8, "members": 2}


def token_data(n: int, seed: int) -> LabeledData:
    """Sequences of a repeating pattern, so next-token prediction is learnable."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, 50, (n, 1), generator=g)
    seq = (start + torch.arange(17)) % 50
    return LabeledData(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


def linear_data(n: int, seed: int) -> LabeledData:
    """Features in [0, 10) and a target linear in them, far from zero mean and unit scale (mean 20 + ...)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 5, generator=g) * 10
    return LabeledData(x, (x @ WEIGHTS + 20 + 0.1 * torch.randn(n, generator=g)).float())


@dataclass(frozen=True)
class ContractTask:
    """A task of the contract: its data (``examples`` to train on, a quarter as many to answer for) and
    the optimizer its stages train with (each task another, so the contract covers them)."""

    task: TaskInfo
    data: Callable[[int, int], LabeledData]
    examples: int
    optimizer: str

    def split(self) -> tuple[LabeledData, LabeledData]:
        return self.data(self.examples, 1), self.data(self.examples // 4, 2)


TASKS = {
    "mlp": ContractTask(MNIST_TASK, lambda n, seed: separable_data(MNIST_TASK, n, seed), 256, "adadelta"),
    "vgg": ContractTask(CIFAR_LIKE, lambda n, seed: separable_data(CIFAR_LIKE, n, seed), 64, "sgd"),
    "tokens": ContractTask(TOKENS, token_data, 64, "adam"),
    "regression": ContractTask(FEATURES, linear_data, 256, "adam"),
}


def contract_keys(name: str, overrides: dict) -> dict:
    """Learner ``name``'s ``learner`` section in a contract case: :data:`SIZES` and ``overrides``."""
    keys = dataclasses.asdict(learner_settings(name, SIZES, overrides))
    del keys["name"]
    return keys
