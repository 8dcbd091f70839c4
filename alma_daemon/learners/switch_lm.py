"""Switch Transformer language models (paper sections 5 and 6.2): SM, and what the LM variants share.

The measure is perplexity, ``exp`` of the mean next-token negative log-likelihood over every token
of the evaluated sequences. A training stage is ``train.steps_per_chunk`` Adam steps (0.9, 0.98,
1e-8) under a warm-up then linear decay, the step-budget mode of the shared loop, so every chunk
gets the same compute; the loss is the token cross-entropy plus ``learner.balance_loss_weight``
times the load-balancing loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from alma_daemon.config import LearnerConfig
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners.base import Learner
from alma_daemon.learners.configs import LanguageModelConfig, SwitchLanguageModelConfig
from alma_daemon.measures import Measurement
from alma_daemon.models.switch import SwitchLM, SwitchLMConfig
from alma_daemon.training.flops import FlopMeter
from alma_daemon.training.loop import FitReport, Trainer

#: Sequences per evaluation batch; its logits are batch x length x vocabulary floats (32 x 64 x 10k: 80 MB).
LM_EVAL_BATCH = 32


def token_nll(log_proba: Callable[[torch.Tensor], torch.Tensor], data: LabeledData, device: torch.device) -> float:
    """Mean negative log-likelihood (nats) per token of ``data``; NaN when there is no token."""
    total, count = 0.0, 0
    for i in range(0, len(data), LM_EVAL_BATCH):
        x, y = data.x[i : i + LM_EVAL_BATCH].to(device), data.y[i : i + LM_EVAL_BATCH].to(device)
        total -= float(log_proba(x).gather(-1, y.unsqueeze(-1)).sum())
        count += y.numel()
    return total / count if count else float("nan")


def validation_loss(net: nn.Module, val: LabeledData, meter: FlopMeter) -> float:
    """The loop's ``validate`` for one network: token cross-entropy, its FLOPs counted as training compute."""

    def log_proba(x: torch.Tensor) -> torch.Tensor:
        return meter.run(("val", tuple(x.shape)), lambda: net(x).logits.log_softmax(-1))

    return token_nll(log_proba, val, val.x.device)


class LanguageModel(Learner):
    """Base of the Switch LM learners: token inputs, perplexity, one step-budget stage per network."""

    task_kinds = ("language_model",)
    config: LanguageModelConfig

    @classmethod
    def contract_cases(cls) -> list[tuple[str, dict[str, Any]]]:
        return [("tokens", {"layers": 1, "d_model": 16, "heads": 2, "d_ff": 32, "experts": 2})]

    def new_network(self, experts: list[int] | None = None) -> SwitchLM:
        """A freshly initialized LM; ``experts`` per block defaults to ``learner.experts`` in every block."""
        c = self.config
        return SwitchLM(
            SwitchLMConfig(
                vocab_size=self.task.num_classes,
                block_size=self.task.input_shape[0],
                d_model=c.d_model,
                heads=c.heads,
                d_ff=c.d_ff,
                experts=tuple(experts or [c.experts] * c.layers),
                dropout=c.dropout,
                capacity_factor=c.capacity_factor,
            )
        )

    def objective(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = net(x)
        loss = F.cross_entropy(out.logits.flatten(0, 1), y.flatten())
        return loss + self.config.balance_loss_weight * out.balance_loss

    def train_network(
        self,
        net: nn.Module,
        train: LabeledData,
        val: LabeledData,
        trainer: Trainer,
        purpose: object = "model",
        data_parallel: bool = False,
    ) -> FitReport:
        """One step-budget stage of ``net``; ``data_parallel``: split over the ranks (one network, not members)."""
        return trainer.fit(
            net,
            train,
            val,
            purpose=purpose,
            objective=self.objective,
            steps=trainer.config.steps_per_chunk,
            validate=validation_loss,
            data_parallel=data_parallel,
        )

    def log_proba(self, x: torch.Tensor) -> torch.Tensor:
        """Next-token log-probabilities (batch, length, vocabulary)."""
        return self.model(x).logits.log_softmax(-1)

    def forward_proba(self, x: torch.Tensor) -> torch.Tensor:
        return self.log_proba(x).exp()

    def measure_on(self, data: LabeledData) -> Measurement:
        """The perplexity, exp(mean next-token NLL), over every token of ``data``; its uncertainty is the
        perplexity measure's fixed one (a chunk's tokens are not independent draws)."""
        self.model.eval()
        with torch.inference_mode():
            return Measurement(math.exp(token_nll(self.log_proba, data, self.device)), data.y.numel(), math.nan)

    def assess_outputs(self, data: LabeledData) -> tuple[Measurement, dict[str, float], torch.Tensor | None]:
        return self.measure_on(data), {}, None

    def example_input(self) -> torch.Tensor:
        return torch.zeros((1, *self.task.input_shape), dtype=torch.long, device=self.device)


class SwitchLanguageModel(LanguageModel):
    """SM: one Switch Transformer LM with ``learner.experts`` experts in every block."""

    name = "switch-lm"
    config_model: ClassVar[type[LearnerConfig]] = SwitchLanguageModelConfig
    splits_batches_over_ranks = True

    def build(self, arch: dict[str, Any]) -> nn.Module:
        return self.new_network()

    def fit(self, train: LabeledData, val: LabeledData, trainer: Trainer) -> FitReport:
        return self.train_network(self.model, train, val, trainer, data_parallel=True)
