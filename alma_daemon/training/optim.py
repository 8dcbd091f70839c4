"""Optimizers of the paper (appendix B), chosen by name or by the dataset's default."""

from __future__ import annotations

from typing import Iterable

import torch

from alma_daemon.config import TrainConfig

#: The paper's choice per dataset: MNIST AdaDelta, CIFAR-10 SGD with momentum, language models Adam.
DEFAULT_OPTIMIZER = {"mnist": "adadelta", "cifar10": "sgd", "ptb": "adam", "text": "adam"}
DEFAULT_LR = {"adadelta": 1.0, "sgd": 0.01, "adam": 1e-3}
DEFAULT_WEIGHT_DECAY = {"adadelta": 0.0, "sgd": 1e-4, "adam": 0.0}


def resolve_optimizer_name(config: TrainConfig, dataset: str) -> str:
    if config.optimizer != "auto":
        return config.optimizer
    return DEFAULT_OPTIMIZER.get(dataset, "adam")


def build_optimizer(name: str, params: Iterable[torch.nn.Parameter], config: TrainConfig) -> torch.optim.Optimizer:
    """A fresh optimizer over ``params``; one per training stage, so parameters added by growth are included."""
    lr = config.lr if config.lr is not None else DEFAULT_LR[name]
    wd = config.weight_decay if config.weight_decay is not None else DEFAULT_WEIGHT_DECAY[name]
    params = [p for p in params if p.requires_grad]
    if name == "adadelta":
        return torch.optim.Adadelta(params, lr=lr, weight_decay=wd)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=config.momentum, weight_decay=wd)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(0.9, 0.98), eps=1e-8, weight_decay=wd)
    raise ValueError(f"unknown optimizer {name!r}")
