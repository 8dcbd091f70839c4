"""Independent ensemble members trained together, as one stacked model (:mod:`alma_daemon.models.stacked`).

:func:`fit_stacked` runs :meth:`Trainer.fit`'s epochs for several members at once, and keeps
everything that makes each member independent: member i draws its shuffling from the generator
``Trainer.fit`` would give it (``purpose=("member", i)``), trains on the task's loss (:mod:`~alma_daemon.training.losses`), is
validated after every epoch on its own,
and stops early on its own patience; a member that stops leaves the stack with its best weights
and the others go on with their optimizer state. One optimizer steps the stacked tensors of all
members at once; the optimizers are elementwise, so each member's update is the one it would get
alone. Since the stacked products are those of the member alone too, each member's weights, and
its report, are bit for bit what ``Trainer.fit`` gives it (tests/test_stacked_members.py); only
the wall time is shared, split by steps. Stacked members run eager whatever ``train.compile`` says
(and say so once): compiling the stacked step measured slower relative to one member (docs/scaling.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from alma_daemon.data.tensors import LabeledData
from alma_daemon.models.backbones import Backbone, inputs_standardized_outside
from alma_daemon.models.stacked import StackedMLP, stackable
from alma_daemon.training.compile import say_eager_once
from alma_daemon.training.flops import FlopMeter
from alma_daemon.training.loop import EVAL_BATCH, EarlyStopping, FitReport, StageInputs, Trainer
from alma_daemon.training.losses import TaskLoss
from alma_daemon.training.optim import FlatOptimizer, build_optimizer
from alma_daemon.training.validated import binomial


def stacked_fitter(
    trainer: Trainer, train: LabeledData, val: LabeledData, loss: TaskLoss
) -> Callable[[Sequence[tuple[int, nn.Module]]], dict[int, FitReport] | None]:
    """Trains ``(index, member)`` pairs on ``loss``, stacked where they allow it (MLP backbones, no
    augmentation); None otherwise."""

    def fit_together(members: Sequence[tuple[int, nn.Module]]) -> dict[int, FitReport] | None:
        indices, nets = [i for i, _ in members], [m for _, m in members]
        # The stack steps every weight of every member; a member with frozen parameters (no built-in
        # learner freezes inside a member, a plugin may) trains alone, where the optimizer leaves them out.
        frozen = any(not p.requires_grad for net in nets for p in net.parameters())
        if trainer.augment or frozen or not stackable(nets):
            return None
        return fit_stacked(trainer, list(zip(indices, nets)), train, val, loss)

    return fit_together


class _Member:
    """One member's place in a stacked fit: its generator, its early stopping, what it did."""

    def __init__(self, index: int, net: Backbone, trainer: Trainer):
        self.index, self.net = index, net
        self.gen = trainer.generator("fit", ("member", index))
        self.stopping = EarlyStopping(trainer.config.patience, trainer.keep_epoch)
        self.flops = self.steps = self.epochs = 0


class _TrainingStack:
    """The members still training as one :class:`StackedMLP`, and one optimizer over its stacked tensors."""

    def __init__(self, nets: Sequence[Backbone], trainer: Trainer):
        self.trainer = trainer
        self.model = StackedMLP(nets)
        self.optimizer = build_optimizer(trainer.optimizer, self.model.parameters(), trainer.config)
        # After the optimizer has moved the stacked tensors into its flat buffer: views of their final place.
        self.model.share_with_members()

    def keep(self, positions: list[int]) -> _TrainingStack:
        """A stack of the members at ``positions`` (in this stack's order) that goes on with their optimizer state."""
        self.model.unshare()
        shapes = [p.shape for p in self.model.parameters()]
        sizes = [shape.numel() for shape in shapes]

        def members_kept(values: torch.Tensor) -> torch.Tensor:
            return torch.cat([v.view(shape)[positions].reshape(-1) for v, shape in zip(values.split(sizes), shapes)])

        kept = _TrainingStack([self.model.members[i] for i in positions], self.trainer)
        kept.optimizer.continue_from(self.optimizer, members_kept)
        return kept

    def close(self) -> None:
        self.model.unshare()


def fit_stacked(
    trainer: Trainer, members: Sequence[tuple[int, Backbone]], train: LabeledData, val: LabeledData, loss: TaskLoss
) -> dict[int, FitReport]:
    """Train stackable members together on ``loss`` for ``train.epochs`` epochs with per-member early stopping."""
    start = time.perf_counter()
    if trainer.config.compile:
        say_eager_once("ensemble members train stacked, which runs eager")
    state = [_Member(index, net, trainer) for index, net in members]
    meter = FlopMeter()
    active = list(state)
    stack = _TrainingStack([m.net for m in active], trainer)
    try:
        with inputs_standardized_outside(nn.ModuleList([m.net for m in state])) as normalize:
            inputs = StageInputs(train, normalize, trainer.device, augment=False)
            val_inputs = StageInputs(val, normalize, trainer.device, augment=False).whole()
            for epoch in range(1, trainer.config.epochs + 1):
                for m in active:
                    m.net.train()
                # Every member's pass has the same batch sizes: one stacked step per batch position.
                passes = [list(trainer.batches(len(inputs), m.gen, None)) for m in active]
                for position in range(len(passes[0])):
                    index = torch.stack([p[position] for p in passes])
                    xb, yb = inputs.batch(index.reshape(-1))
                    xb, yb = xb.view(*index.shape, *xb.shape[1:]), yb.view(index.shape)
                    key = ("train", len(active), tuple(xb.shape))
                    meter.run(key, lambda: _stacked_step(trainer, loss, stack.model, stack.optimizer, xb, yb))
                    for m in active:
                        m.flops += meter.share(key) // len(active)
                        m.steps += 1
                errors = _validation_values(trainer, loss, stack.model, active, val_inputs, meter)
                still = []
                for m, error in zip(active, errors):
                    m.epochs = epoch
                    if not m.stopping.update(error, epoch, m.net):
                        still.append(m)
                if not still:
                    break
                if len(still) < len(active):
                    stack = stack.keep([active.index(m) for m in still])
                active = still
    finally:
        stack.close()
    for m in state:
        m.stopping.restore(m.net)
    if trainer.device.type == "cuda":
        torch.cuda.synchronize(trainer.device)
    seconds = time.perf_counter() - start
    total_steps = max(1, sum(m.steps for m in state))
    return {
        m.index: FitReport(
            flops=m.flops,
            seconds=seconds * m.steps / total_steps,
            steps=m.steps,
            epochs=m.epochs,
            best_epoch=m.stopping.best_epoch,
            val_error=m.stopping.best_error,
        )
        for m in state
    }


def _stacked_step(
    trainer: Trainer,
    loss: TaskLoss,
    model: StackedMLP,
    optimizer: FlatOptimizer,
    x: torch.Tensor,
    y: torch.Tensor,
) -> None:
    """One optimizer step of every member on its own batch; the loss is the sum of the members' mean losses."""
    optimizer.zero_grad()
    with trainer.autocast():
        total = loss.stacked_loss(model(x), y)
    total.backward()
    optimizer.step()


def _validation_values(
    trainer: Trainer, loss: TaskLoss, model: StackedMLP, members: list[_Member], val: LabeledData, meter: FlopMeter
) -> list[float]:
    """Each member's early-stopping value on ``val`` (``loss.validate``'s), from stacked passes (counted
    per member, as Trainer.fit counts)."""
    for m in members:
        m.net.eval()
    wrong = torch.zeros(len(members), dtype=torch.long, device=val.y.device)
    outputs = []
    with torch.inference_mode(), trainer.autocast():
        for i in range(0, len(val), EVAL_BATCH):
            xb, yb = val.x[i : i + EVAL_BATCH], val.y[i : i + EVAL_BATCH]
            key = ("val", len(members), tuple(xb.shape))
            raw = meter.run(key, lambda: model(xb.expand(len(members), *xb.shape)))
            for m in members:
                m.flops += meter.share(key) // len(members)
            if loss.counts_errors:
                wrong += (raw.argmax(2) != yb).sum(1)
            else:
                outputs.append(raw)
    if not loss.counts_errors:
        whole = torch.cat(outputs, 1) if outputs else None
        return [math.nan if whole is None else loss.validation_value(whole[k], val.y) for k in range(len(members))]
    return [binomial(w, len(val)) for w in wrong.tolist()]
