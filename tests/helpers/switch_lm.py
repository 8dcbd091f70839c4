"""A tiny Switch LM learner and a step-budget trainer."""

from __future__ import annotations

import torch

from alma_daemon.config import TrainConfig
from alma_daemon.learners import build_learner
from alma_daemon.training.loop import Trainer
from tests.helpers.configs import learner_settings
from tests.helpers.contract import TOKENS

TINY = {"layers": 2, "d_model": 16, "heads": 2, "d_ff": 32, "experts": 3, "dropout": 0.0}


def tiny_learner(name: str, **overrides):
    return build_learner(name, TOKENS, learner_settings(name, TINY, overrides), seed=0)


def trainer(steps: int = 4, stage: int = 1) -> Trainer:
    config = TrainConfig(batch_size=16, steps_per_chunk=steps, warmup_steps=2, lr=3e-3)
    return Trainer(config, "adam", torch.device("cpu"), seed=stage)
