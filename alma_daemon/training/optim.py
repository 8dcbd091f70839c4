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


def warmup_linear_decay(optimizer: torch.optim.Optimizer, steps: int, warmup: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The LM schedule of appendix B.2: linear warm-up over ``warmup`` steps, then linear decay towards 0.

    Step ``s`` (0-based) runs at ``lr * (s + 1) / warmup`` during warm-up and ``lr * (steps - s) /
    (steps - warmup)`` after, so the last of ``steps`` steps still moves (at ``lr / (steps - warmup)``).
    """
    warmup = min(warmup, steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (steps - step) / max(1, steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
