"""The one training loop shared by every learner.

:meth:`Trainer.fit` trains one ``nn.Module`` (a backbone, a mixture, a new ensemble member) on a
stage's data with mini-batches, evaluates on the stage's validation set after every epoch, stops
early after ``patience`` epochs without improvement and restores the best epoch. With a step budget
(``steps``, language models) the stage is instead exactly that many steps under a warm-up then
linear-decay learning rate, validated once at the end. Learners differ in *what* they hand to the
loop, never in the loop itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from alma_daemon.config import TrainConfig
from alma_daemon.data.augment import flip_and_crop
from alma_daemon.data.tensors import LabeledData
from alma_daemon.models.dropout import draw_dropout_from
from alma_daemon.seeding import generator as seeded_generator
from alma_daemon.training.flops import FlopMeter
from alma_daemon.training.optim import build_optimizer, warmup_linear_decay

#: Mini-batch size for evaluation passes (no gradients, so larger than training batches).
EVAL_BATCH = 2048

#: ``objective(net, x, y) -> scalar loss``; the default is cross-entropy on ``net(x)``.
Objective = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


#: ``validate(net, val, meter) -> float``, lower is better; called in eval mode without gradients.
Validate = Callable[[nn.Module, LabeledData, FlopMeter], float]


def cross_entropy_objective(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(net(x), y)


@dataclass
class FitReport:
    """What one training stage cost and achieved."""

    flops: int = 0
    seconds: float = 0.0
    steps: int = 0
    epochs: int = 0
    best_epoch: int = 0
    val_error: float | None = None
    details: dict = field(default_factory=dict)

    def merge(self, other: "FitReport") -> "FitReport":
        """Combine reports of parts trained one after another (ensemble members)."""
        return FitReport(
            flops=self.flops + other.flops, seconds=self.seconds + other.seconds,
            steps=self.steps + other.steps, epochs=self.epochs + other.epochs,
            best_epoch=max(self.best_epoch, other.best_epoch),
            val_error=other.val_error if self.val_error is None else self.val_error,
        )


class Trainer:
    """Runs the training loop for one stage; seeded by (run seed, stage index) for exact resumes."""

    def __init__(self, config: TrainConfig, optimizer: str, device: torch.device, seed: int, augment: bool = False):
        self.config = config
        self.optimizer = optimizer
        self.device = device
        self.seed = seed
        self.augment = augment

    def generator(self, *purpose: object) -> torch.Generator:
        """A CPU generator for shuffling/augmentation that depends only on the stage seed and ``purpose``."""
        return seeded_generator(self.seed, *purpose)

    def fit(
        self,
        net: nn.Module,
        train: LabeledData,
        val: LabeledData,
        *,
        purpose: object = "model",
        params: Iterable[nn.Parameter] | None = None,
        objective: Objective = cross_entropy_objective,
        steps: int | None = None,
        validate: Validate | None = None,
    ) -> FitReport:
        """Train ``net`` (only ``params`` if given) and keep its best state on the validation measure.

        By default: epochs with early stopping on the validation error. With ``steps``: one round of
        exactly ``steps`` batches (drawn from consecutive reshuffled passes) under a linear warm-up over
        ``warmup_steps`` then a linear decay to zero, validated at its end (paper appendix B.2: the same
        compute for every chunk). ``validate`` replaces the classification error (e.g. a validation loss).
        """
        start = time.perf_counter()
        gen = self.generator("fit", purpose)
        draw_dropout_from(net, seeded_generator(self.seed, "dropout", purpose, device=self.device))
        x, y = train.x.to(self.device), train.y.to(self.device)
        val = LabeledData(val.x.to(self.device), val.y.to(self.device))
        optimizer = build_optimizer(self.optimizer, net.parameters() if params is None else params, self.config)
        schedule = warmup_linear_decay(optimizer, steps, self.config.warmup_steps) if steps is not None else None
        validate = validate or self.validation_error
        meter = FlopMeter()
        best_error, best_state, best_epoch, bad_epochs, steps_done = float("inf"), None, 0, 0, 0
        epoch = 0
        for epoch in range(1, (1 if steps is not None else self.config.epochs) + 1):
            net.train()
            for index in self._batches(len(y), gen, steps):
                index = index.to(self.device)
                xb, yb = x[index], y[index]
                if self.augment:
                    xb = flip_and_crop(xb, gen)
                meter.run(("train", tuple(xb.shape)), lambda: self._step(net, optimizer, objective, xb, yb))
                if schedule is not None:
                    schedule.step()
                steps_done += 1
            net.eval()
            with torch.inference_mode():
                error = validate(net, val, meter)
            if error < best_error:
                best_error, best_epoch, bad_epochs = error, epoch, 0
                best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
            else:
                bad_epochs += 1
                if bad_epochs > self.config.patience:
                    break
        if best_state is not None:
            net.load_state_dict(best_state)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return FitReport(
            flops=meter.total, seconds=time.perf_counter() - start, steps=steps_done, epochs=epoch,
            best_epoch=best_epoch, val_error=best_error,
        )

    def _batches(self, n: int, gen: torch.Generator, steps: int | None) -> Iterator[torch.Tensor]:
        """Index batches: one shuffled pass, or ``steps`` full batches from consecutive shuffled passes."""
        batch = self.config.batch_size
        if steps is None:
            yield from torch.randperm(n, generator=gen).split(batch)
            return
        queue = torch.empty(0, dtype=torch.long)
        for _ in range(steps):
            while len(queue) < batch:
                queue = torch.cat([queue, torch.randperm(n, generator=gen)])
            yield queue[:batch]
            queue = queue[batch:]

    @staticmethod
    def _step(net: nn.Module, optimizer: torch.optim.Optimizer, objective: Objective,
              x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        objective(net, x, y).backward()
        optimizer.step()

    @staticmethod
    def validation_error(net: nn.Module, val: LabeledData, meter: FlopMeter | None = None) -> float:
        """Classification error of ``net`` on ``val`` (validation passes count as training compute)."""
        net.eval()
        wrong = 0
        with torch.inference_mode():
            for i in range(0, len(val), EVAL_BATCH):
                xb, yb = val.x[i : i + EVAL_BATCH], val.y[i : i + EVAL_BATCH]
                logits = meter.run(("val", tuple(xb.shape)), lambda: net(xb)) if meter else net(xb)
                wrong += int((logits.argmax(1) != yb).sum())
        return wrong / max(1, len(val))
